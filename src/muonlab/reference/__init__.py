"""Teacher-forced check of the baseline against recorded upstream reference bundles."""

from muonlab.reference.verify import ReferenceReport, verify_bundle

__all__ = ["ReferenceReport", "verify_bundle"]
