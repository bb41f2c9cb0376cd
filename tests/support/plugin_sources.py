"""The source of a plug-in conditioner the tests write to a file and load with --plugin."""

import textwrap

CONDITIONER = textwrap.dedent('''
    """A plug-in conditioner: the sign of the Nesterov tensor (the whole step is then a
    Muon step of sign(G)); nothing in muonlab names it."""
    from dataclasses import dataclass

    from muonlab.optim.extensions import PrePolar, register_prepolar


    @dataclass(frozen=True)
    class SignConditioner(PrePolar):
        def condition(self, G, inputs, ctx):
            return G.sign()


    register_prepolar("plugin_sign", SignConditioner, paper="test plug-in", tests=("tests/plugins/test_plugins.py",),
                      replace=True)
''')
