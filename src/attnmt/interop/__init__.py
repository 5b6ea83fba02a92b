"""Interoperability with Hugging Face Marian (opus-mt) models and CTranslate2.

Nothing here is needed to train: these modules read and write other toolkits' files, and
only `ctranslate2.py` imports an optional package (`pip install 'attnmt[hf]'`).
"""
