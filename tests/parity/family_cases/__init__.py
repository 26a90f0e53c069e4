"""One parity case file per family (tests/parity/test_every_family.py runs them): <model_type>.py defines
CASES, case id -> a function building a tiny random `transformers` model of that family, which
family_parity.check_family opens, compares and saves back. A family in the registry without its file
fails the suite."""
