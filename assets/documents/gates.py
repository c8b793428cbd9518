"""The documents dataset's landing gate: Great Expectations suites (``suites/documents.json``)
over the exact figures of the screening pass and a seeded sample of documents, evaluated when
the day lands, before any model reads it.
"""

from __future__ import annotations

from pathlib import Path

from assets.documents.quality import QUARANTINED_REASONS
from assets.documents.schemas import DATASET
from assets.gates import LandingGate
from resources.quality import load_suites

DOCUMENT_SUITES = load_suites(Path(__file__).parent / "suites" / "documents.json")
# The `documents` suites over each day's screening figures and a sample of documents.
DOCUMENTS_GATE = LandingGate(DATASET, DOCUMENT_SUITES, QUARANTINED_REASONS)
