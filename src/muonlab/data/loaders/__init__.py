"""Seed paper 004's loaders over token memmaps (`muonlab.data.memmap_format`), one per setting:
`token_blocks` (NanoGPT / MoE blocks, and the view the others build on), `prefix_continuation`
(small T5) and `image_tokens` (ImageGPT). All are infinite, seeded, rank-aware and resumable."""
