"""Tiny random Hugging Face model folders, built offline at test time for every task and tokenizer family.

Tokenizers are trained on a small English corpus: WordPiece (BERT, DistilBERT), byte-level BPE (RoBERTa)
and Unigram (XLM-RoBERTa), the three families hare must serve.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from container.optimize.textset import RANKING, SENTENCES

CORPUS = [*SENTENCES, *RANKING, "Angela Merkel met Emmanuel Macron in Paris and Berlin."] * 4
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
CLASS_LABELS = ["negative", "neutral", "positive"]
ARCHS = ("bert", "distilbert", "roberta", "xlm-roberta")
MAX_POSITIONS = 128
SPECIALS_BERT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SPECIALS_ROBERTA = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def _wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=400, special_tokens=SPECIALS_BERT))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


def _bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=SPECIALS_ROBERTA,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True)
    return tok


def _unigram() -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        CORPUS, trainers.UnigramTrainer(vocab_size=300, special_tokens=SPECIALS_ROBERTA, unk_token="<unk>")
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return tok


def _save_tokenizer(arch: str, folder: Path) -> int:
    """Train the arch's tokenizer family and save it the way transformers does; returns the vocab size."""
    from transformers import PreTrainedTokenizerFast

    if arch in ("bert", "distilbert"):
        tok, specials = (
            _wordpiece(),
            dict(
                unk_token="[UNK]",
                pad_token="[PAD]",
                cls_token="[CLS]",
                sep_token="[SEP]",
                mask_token="[MASK]",
            ),
        )
    else:
        tok = _bpe() if arch == "roberta" else _unigram()
        specials = dict(
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
            pad_token="<pad>",
            cls_token="<s>",
            sep_token="</s>",
            mask_token="<mask>",
        )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=MAX_POSITIONS - 2, **specials)
    fast.save_pretrained(str(folder))
    return int(tok.get_vocab_size())


def _config(arch: str, vocab: int, extra: dict[str, Any]) -> Any:
    import transformers

    common = dict(vocab_size=vocab, max_position_embeddings=MAX_POSITIONS, **extra)
    if arch == "distilbert":
        return transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, pad_token_id=0, **common)
    size = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if arch == "bert":
        return transformers.BertConfig(**size, pad_token_id=0, **common)
    cls = transformers.RobertaConfig if arch == "roberta" else transformers.XLMRobertaConfig
    return cls(**size, pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1, **common)


HEADS = {
    "text-classification": ("ForSequenceClassification", CLASS_LABELS),
    "token-classification": ("ForTokenClassification", NER_LABELS),
    "text-ranking": ("ForSequenceClassification", ["relevance"]),
    "feature-extraction": ("Model", []),
}
PREFIX = {"bert": "Bert", "distilbert": "DistilBert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta"}


def make_model(folder: Path, task: str, arch: str = "bert", seed: int = 0, **config: Any) -> Path:
    """Write a tiny random `arch` model for `task` to `folder` (weights as safetensors)."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _save_tokenizer(arch, folder)
    suffix, labels = HEADS[task]
    extra: dict[str, Any] = dict(config)
    if labels:
        extra |= {"id2label": dict(enumerate(labels)), "label2id": {v: i for i, v in enumerate(labels)}}
    torch.manual_seed(seed)
    model = getattr(transformers, PREFIX[arch] + suffix)(_config(arch, vocab, extra)).eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    if task == "feature-extraction":
        _sentence_transformers_files(folder)
    return folder


def _sentence_transformers_files(folder: Path) -> None:
    """modules.json + 1_Pooling, as sentence-transformers writes them (mean pooling, then Normalize)."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True})
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))
