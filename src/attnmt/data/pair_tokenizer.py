"""Two sentencepiece models, one for the source language and one for the target, over one
shared vocabulary file (`vocab.json`: piece → id), as Marian / opus-mt models tokenize.

The sentencepiece models only split text into pieces; the ids come from `vocab.json`, where
attnmt's special ids hold (pad 0, eos 1, unk 3: attnmt.interop orders an imported vocabulary
so). A piece missing from the vocabulary is unknown. A source line may start with a target
language code such as `>>fra<<`, which is one vocabulary entry, as in Marian.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from attnmt.common import EOS_ID, PAD_ID, UNK_ID
from attnmt.data.tokenizer import SpecialIds, sentencepiece_encode
from attnmt.errors import DataError

VOCAB_FILE = "vocab.json"
SOURCE_SPM = "source.spm"
TARGET_SPM = "target.spm"


def _load_spm(path: Path) -> spm.SentencePieceProcessor:
    if not path.is_file():
        raise DataError(f"{path}: sentencepiece model not found")
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as e:
        raise DataError(f"{path}: not a readable sentencepiece model ({e})") from None


def read_vocab(path: Path) -> dict[str, int]:
    """piece → id, checked to be a bijection onto 0..n-1."""
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: vocabulary not found") from None
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable JSON vocabulary ({e})") from None
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
        raise DataError(f"{path}: must map every piece to a distinct id 0..n-1")
    return vocab


class PairTokenizer(SpecialIds):
    """Encodes source text with the source model and target text with the target model;
    decodes (target) ids up to the first EOS, without pad and the decoder start token."""

    def __init__(self, folder: str | Path, decoder_start_id: int = PAD_ID) -> None:
        folder = Path(folder)
        self.path = folder / VOCAB_FILE
        self.files = (self.path, folder / SOURCE_SPM, folder / TARGET_SPM)
        self._vocab = read_vocab(self.path)
        self._pieces = sorted(self._vocab, key=self._vocab.__getitem__)
        self._size = len(self._pieces)
        self._source = _load_spm(folder / SOURCE_SPM)
        self._target = _load_spm(folder / TARGET_SPM)
        self._start = decoder_start_id
        for name, i in (("pad", PAD_ID), ("eos", EOS_ID), ("unk", UNK_ID)):
            if i >= len(self._pieces) or self._pieces[i] not in ("<pad>", "</s>", "<unk>"):
                raise DataError(f"{self.path}: id {i} must be the {name} token")

    def _ids(self, pieces: Iterable[str]) -> list[int]:
        return [self._vocab.get(piece, UNK_ID) for piece in pieces]

    def encode(self, text: str) -> list[int]:
        """Source token ids of `text`, without EOS."""
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        return self._ids([*code, *sentencepiece_encode(self._source, text, out_type=str)])

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [
            self._ids(pieces)
            for pieces in sentencepiece_encode(self._target, list(texts), out_type=str)
        ]

    def decode(self, ids: Sequence[int]) -> str:
        """Target text of `ids` up to the first EOS, ignoring pad and the start token."""
        pieces = []
        for i in map(int, ids):
            if i == EOS_ID:
                break
            if i in (PAD_ID, self._start):
                continue
            pieces.append(self._pieces[i] if 0 <= i < len(self._pieces) else "<unk>")
        return self._target.decode_pieces(pieces).replace("\u2581", " ").strip()

    def decode_batch(self, batch: Iterable[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary piece of each id (for labelling attention maps)."""
        return [self._pieces[int(i)] for i in ids]
