"""Offline maintenance tools of a gac checkout, kept out of the wheel (nothing in ``gac`` imports them): the
extraction of the published A100/H100 profiles from the GAC authors' figure PDFs (:mod:`tools.extract_published`,
:mod:`tools.pdf_vectors`, :mod:`tools.published_report`). Run them from the checkout's root, e.g.
``python -m tools.extract_published GAC_CHECKOUT``."""
