"""Tiny random Hugging Face model folders, built offline at test time for every family hare proves.

FAMILIES is the one list of model families the tests iterate over (and the README's support table is
checked against it): each family's real configuration knobs (relative attention, factorized embeddings,
local attention...) at tiny sizes, with a tokenizer of its real kind (WordPiece, byte-level BPE or Unigram)
trained on (Unigram: scored from) a small English corpus and saved the way transformers saves it.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from container.optimize.textset import RANKING, SENTENCES

CORPUS = [*SENTENCES, *RANKING, "Angela Merkel met Emmanuel Macron in Paris and Berlin."] * 4
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
CLASS_LABELS = ["negative", "neutral", "positive"]
MAX_POSITIONS = 128
LM_POSITIONS = 512
SPECIALS = {
    "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    # Qwen-style: one end-of-text token (EOS and padding), chat markers; no BOS, no unknown token.
    "decoder": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
}
SIZE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
# Decoders: grouped-query attention (2 key/value heads for 4 query heads), rotary positions.
DECODER = SIZE | dict(num_key_value_heads=2, head_dim=8)
# Sliding-window layers narrower than the test inputs, so the window's mask is exercised.
WINDOW = 8
# Linear-attention (gated delta rule) layers at tiny sizes: 2 key heads and 4 value heads of 8.
LINEAR = dict(linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)
# Encoder-decoders: only their encoder is served, for embeddings.
EMBEDDINGS = ("feature-extraction",)
# What an embedding decoder's sentence-transformers folder declares (Qwen3-Embedding's shape of prompt).
DECODER_PROMPTS = {"query": "Instruct: Given a web search query, retrieve relevant passages\nQuery: ", "document": ""}


@dataclass(frozen=True)
class Family:
    """One model family as the fixtures build it.

    tokenizer: wordpiece, bpe (byte-level) or unigram; specials: bert ([CLS] A [SEP] B [SEP]) or roberta
    (<s> A </s></s> B </s>). config: the family's configuration at tiny sizes. segments: whether the exported
    graph should take token_type_ids (the model has more than one segment type). tasks: the tasks
    transformers has a head for in this family (Gemma 3 has no token-classification head).
    """

    model_type: str
    tokenizer: str
    specials: str
    config: dict[str, Any] = field(default_factory=dict)
    segments: bool = False
    tasks: tuple[str, ...] = ("text-classification", "token-classification", "feature-extraction", "text-ranking")


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("bert", "wordpiece", "bert", SIZE, segments=True),
        Family("distilbert", "wordpiece", "bert", dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64)),
        Family("roberta", "bpe", "roberta", SIZE | dict(type_vocab_size=1)),
        Family("xlm-roberta", "unigram", "roberta", SIZE | dict(type_vocab_size=1)),
        Family("camembert", "unigram", "roberta", SIZE | dict(type_vocab_size=1)),
        Family("mpnet", "wordpiece", "roberta", SIZE | dict(relative_attention_num_buckets=32)),
        # DeBERTa (v1): disentangled attention, no absolute positions, no segments (microsoft/deberta-base).
        Family(
            "deberta",
            "bpe",
            "bert",
            SIZE
            | dict(
                relative_attention=True,
                pos_att_type=["c2p", "p2c"],
                max_relative_positions=-1,
                position_biased_input=False,
                type_vocab_size=0,
            ),
        ),
        # DeBERTa-v2/v3: log-bucketed relative positions, shared keys (microsoft/deberta-v3-base; fewer buckets
        # than its 256 so that sequences longer than a bucket are exercised at this tiny length).
        Family(
            "deberta-v2",
            "unigram",
            "bert",
            SIZE
            | dict(
                relative_attention=True,
                pos_att_type=["p2c", "c2p"],
                max_relative_positions=-1,
                position_buckets=32,
                norm_rel_ebd="layer_norm",
                share_att_key=True,
                position_biased_input=False,
                type_vocab_size=0,
            ),
        ),
        Family("electra", "wordpiece", "bert", SIZE | dict(embedding_size=16), segments=True),
        Family("albert", "unigram", "bert", SIZE | dict(embedding_size=16), segments=True),
        # ModernBERT: alternating global and sliding-window attention (a window shorter than the inputs).
        Family(
            "modernbert",
            "bpe",
            "bert",
            SIZE | dict(global_attn_every_n_layers=2, local_attention=16, reference_compile=False),
        ),
        # Decoders: byte-level BPE with the EOS appended by the post-processor and left padding, as
        # Qwen3-Embedding ships its tokenizer.
        Family("qwen2", "bpe", "decoder", DECODER),
        Family("qwen3", "bpe", "decoder", DECODER),
        Family("llama", "bpe", "decoder", DECODER),
        # Mistral: one sliding window for every layer.
        Family("mistral", "bpe", "decoder", DECODER | dict(sliding_window=WINDOW)),
        Family("gemma2", "bpe", "decoder", DECODER | dict(sliding_window=WINDOW)),
        # Gemma 3: sliding and full layers alternating (EmbeddingGemma's bidirectional variant in the tests).
        Family(
            "gemma3_text",
            "bpe",
            "decoder",
            DECODER | dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]),
            tasks=("text-classification", "feature-extraction", "text-ranking"),
        ),
        # transformers 5's own encoders, once remote code (NomicBERT, new GTE, Jina v3) or new: rotary
        # positions; EuroBERT and UltraBERT with Llama-style grouped-query attention and RMSNorm, UltraBERT
        # with alternating sliding-window and full layers.
        Family("nomic_bert", "wordpiece", "bert", SIZE, segments=True),
        Family("gte", "unigram", "roberta", SIZE | dict(type_vocab_size=1)),
        Family("jina_embeddings_v3", "unigram", "roberta", SIZE | dict(type_vocab_size=1)),
        Family("eurobert", "bpe", "roberta", DECODER),
        Family(
            "ultrabert",
            "bpe",
            "bert",
            DECODER
            | dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"], prediction_head_size=32),
        ),
        # OpenAI's privacy filter: a bidirectional sliding-window encoder with mixture-of-experts layers, and
        # only a token-classification head.
        Family(
            "openai_privacy_filter",
            "bpe",
            "roberta",
            DECODER | dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW),
            tasks=("token-classification",),
        ),
        Family("ministral3", "bpe", "decoder", DECODER),
        # Mistral 4: multi-head latent attention and mixture-of-experts layers (no causal-LM Auto class).
        Family(
            "mistral4",
            "bpe",
            "decoder",
            DECODER
            | dict(
                num_key_value_heads=4,
                moe_intermediate_size=16,
                n_routed_experts=4,
                num_experts_per_tok=2,
                kv_lora_rank=16,
                q_lora_rank=16,
                qk_rope_head_dim=4,
                v_head_dim=8,
                qk_nope_head_dim=4,
            ),
        ),
        # Gemma 4 (text): per-layer inputs, sliding and full layers; transformers has only its base model and LM.
        Family(
            "gemma4_text",
            "bpe",
            "decoder",
            DECODER
            | dict(
                sliding_window=WINDOW,
                layer_types=["sliding_attention", "full_attention"],
                hidden_size_per_layer_input=8,
            ),
            tasks=("feature-extraction",),
        ),
        # Qwen3.5 (text): gated-delta-rule (linear attention) layers between gated full-attention layers.
        Family(
            "qwen3_5_text",
            "bpe",
            "decoder",
            DECODER | LINEAR | dict(layer_types=["linear_attention", "full_attention"]),
            tasks=("text-classification", "feature-extraction", "text-ranking"),
        ),
        # OLMo hybrid and Lara mini: the same gated delta rule beside attention (Lara mini with experts too);
        # transformers has only their base model and LM.
        Family(
            "olmo_hybrid",
            "bpe",
            "decoder",
            DECODER | dict(layer_types=["linear_attention", "full_attention"]),
            tasks=EMBEDDINGS,
        ),
        Family(
            "lara_mini",
            "bpe",
            "decoder",
            DECODER
            | LINEAR
            | dict(
                moe_intermediate_size=16,
                shared_expert_intermediate_size=16,
                num_experts=4,
                num_experts_per_tok=2,
                layer_types=["linear_attention", "full_attention"],
            ),
            tasks=EMBEDDINGS,
        ),
        # ModernVBERT: ModernBERT's text model behind a SigLIP vision tower; text without images is ModernBERT's.
        Family(
            "modernvbert",
            "bpe",
            "bert",
            dict(
                text_config=SIZE | dict(global_attn_every_n_layers=2, local_attention=16, reference_compile=False),
                vision_config=dict(
                    model_type="siglip_vision_model",
                    hidden_size=16,
                    intermediate_size=32,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    image_size=32,
                    patch_size=16,
                ),
            ),
            # Ranking has no reference: sentence-transformers' CrossEncoder feeds pairs through the folder's
            # processor (Idefics3's), which takes no pairs.
            tasks=("text-classification", "token-classification", "feature-extraction"),
        ),
        # LFM2: gated short convolutions (a causal Conv1d of 3 taps) before and after an attention layer, as in
        # LiquidAI's checkpoints (which interleave 10 and 6); transformers has only its base model and LM.
        Family(
            "lfm2",
            "bpe",
            "decoder",
            DECODER
            | dict(
                num_hidden_layers=3,
                layer_types=["conv", "full_attention", "conv"],
                conv_bias=True,
                block_auto_adjust_ff_dim=False,
            ),
            tasks=("feature-extraction",),
        ),
        # Encoder-decoders serve embeddings from their encoder, as sentence-transformers does: T5 (sentence-t5,
        # GTR; its heads read the decoder at its EOS tokens: refused) and T5Gemma 2 (Gemma 3 layers in a
        # bidirectional encoder, which also takes images through SigLIP; a sliding window narrower than the test
        # inputs), whose heads read the decoder fed the input shifted right (export.SHIFTED_HEADS).
        Family(
            "t5", "unigram", "roberta", dict(d_model=32, num_layers=2, num_heads=4, d_ff=64, d_kv=8), tasks=EMBEDDINGS
        ),
        Family(
            "t5gemma2",
            "bpe",
            "decoder",
            dict(
                encoder=dict(
                    text_config=DECODER | dict(sliding_window=WINDOW),
                    vision_config=dict(
                        hidden_size=16,
                        intermediate_size=32,
                        num_hidden_layers=1,
                        num_attention_heads=2,
                        image_size=32,
                        patch_size=16,
                    ),
                    mm_tokens_per_image=4,
                ),
                decoder=DECODER | dict(sliding_window=WINDOW),
            ),
            # Ranking has no reference: sentence-transformers' CrossEncoder feeds pairs through the folder's
            # processor (Gemma 3's), which takes no pairs.
            tasks=("text-classification", "token-classification", "feature-extraction"),
        ),
    )
}
# What a state-space (Mamba-2) mixer needs to be tiny: 4 heads of 16 (twice the hidden size), 8 states, chunks of 16.
MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_chunk_size=16)
DECODER_TASKS = ("text-classification", "feature-extraction", "text-ranking")
# Families transformers knows that hare refuses, each at the stage that names why (docs/optimizer.md lists them).
REFUSED: dict[str, Family] = {
    f.model_type: f
    for f in (
        # MiniMax: lightning attention (a linear attention that is no gated delta rule) between attention layers.
        Family(
            "minimax",
            "bpe",
            "decoder",
            DECODER
            | dict(num_local_experts=4, num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"]),
            tasks=DECODER_TASKS,
        ),
        # Mamba-style hybrids and pure state-space or recurrent models, each with the knobs that make it tiny
        # (whether its config lists layer types or not: RWKV and xLSTM do not). tasks: their transformers heads.
        Family(
            "jamba",
            "bpe",
            "decoder",
            DECODER
            | dict(attn_layer_period=2, attn_layer_offset=1, num_experts=2, expert_layer_period=2, mamba_d_state=8),
            tasks=DECODER_TASKS,
        ),
        Family(
            "zamba",
            "bpe",
            "decoder",
            DECODER
            | dict(num_hidden_layers=4, layers_block_type=["mamba", "hybrid"] * 2, mamba_d_state=8, n_mamba_heads=2),
            tasks=DECODER_TASKS,
        ),
        Family(
            "zamba2",
            "bpe",
            "decoder",
            DECODER
            | dict(
                layers_block_type=["mamba", "hybrid"],
                hybrid_layer_ids=[1],
                mamba_headdim=16,
                n_mamba_heads=4,
                mamba_d_state=8,
                mamba_ngroups=1,
                chunk_size=16,
            ),
            tasks=DECODER_TASKS,
        ),
        Family(
            "bamba", "bpe", "decoder", DECODER | MAMBA2 | dict(attn_layer_indices=[1]), tasks=("feature-extraction",)
        ),
        Family(
            "nemotron_h",
            "bpe",
            "decoder",
            DECODER
            | dict(hybrid_override_pattern="M*", mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, chunk_size=16),
            tasks=("feature-extraction",),
        ),
        Family(
            "granitemoehybrid",
            "bpe",
            "decoder",
            DECODER | MAMBA2 | dict(layer_types=["mamba", "attention"], num_local_experts=2, num_experts_per_tok=1),
            tasks=("feature-extraction",),
        ),
        Family("falcon_h1", "bpe", "decoder", DECODER | MAMBA2 | dict(mamba_d_ssm=64), tasks=("feature-extraction",)),
        Family("mamba", "bpe", "decoder", DECODER | dict(state_size=8), tasks=("feature-extraction",)),
        Family(
            "mamba2",
            "bpe",
            "decoder",
            DECODER | dict(num_heads=4, head_dim=16, state_size=8, n_groups=1, chunk_size=16),
            tasks=("feature-extraction",),
        ),
        Family("falcon_mamba", "bpe", "decoder", DECODER | dict(state_size=8), tasks=("feature-extraction",)),
        Family(
            "recurrent_gemma",
            "bpe",
            "decoder",
            DECODER | dict(lru_width=32, block_types=["recurrent", "attention"], attention_window_size=WINDOW),
            tasks=("feature-extraction",),
        ),
        Family("rwkv", "bpe", "decoder", DECODER | dict(attention_hidden_size=32), tasks=("feature-extraction",)),
        Family(
            "xlstm",
            "bpe",
            "decoder",
            DECODER | dict(embedding_dim=32, num_blocks=2, qk_dim_factor=0.5, v_dim_factor=1.0, chunk_size=8),
            tasks=("feature-extraction",),
        ),
        Family(
            "kimi_linear",
            "bpe",
            "decoder",
            DECODER
            | dict(
                kv_lora_rank=16,
                qk_rope_head_dim=4,
                qk_nope_head_dim=4,
                v_head_dim=8,
                moe_intermediate_size=16,
                num_experts=2,
                num_experts_per_tok=1,
                linear_attn_config={
                    "kda_layers": [1],
                    "full_attn_layers": [2],
                    "num_heads": 4,
                    "head_dim": 8,
                    "short_conv_kernel_size": 4,
                },
            ),
            tasks=("feature-extraction",),
        ),
        Family(
            "bailing_hybrid",
            "bpe",
            "decoder",
            DECODER | dict(layer_types=["linear_attention", "full_attention"]),
            tasks=("feature-extraction",),
        ),
    )
}
ARCHS: Sequence[str] = tuple(FAMILIES)
TASK_ORDER = ("text-classification", "token-classification", "feature-extraction", "text-ranking")
# The fast suite meets each family once, with the tasks rotated over the families so every task meets
# several tokenizer kinds; the other (family, task) pairs run under the slow marker.
FAST_PAIRS = [
    (arch, next(t for k in range(len(TASK_ORDER)) if (t := TASK_ORDER[(i + k) % len(TASK_ORDER)]) in f.tasks))
    for i, (arch, f) in enumerate(FAMILIES.items())
]
SLOW_PAIRS = [(a, t) for a, f in FAMILIES.items() for t in TASK_ORDER if t in f.tasks and (a, t) not in FAST_PAIRS]


def _tokenizer(kind: str, specials: list[str]) -> Tokenizer:
    """A tokenizer of `kind` for the corpus (no post-processor yet), the same on every run: a fresh copy of
    the one built first for (kind, specials), since callers change theirs (WordPiece's merges, in Python, took
    about half a second a model)."""
    return Tokenizer.from_str(_tokenizer_json(kind, tuple(specials)))


@functools.cache
def _tokenizer_json(kind: str, specials: tuple[str, ...]) -> str:
    return _build_tokenizer(kind, list(specials)).to_str()


def _build_tokenizer(kind: str, specials: list[str]) -> Tokenizer:
    """Byte-level BPE is trained (its trainer is deterministic); WordPiece and Unigram are built here, because
    their trainers give a different vocabulary on every run, and with it a different tiny model."""
    unk = specials[1] if specials[0] == "[PAD]" else "<unk>"
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            CORPUS,
            trainers.BpeTrainer(
                vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
            ),
        )
        return tok
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
    words = _corpus_words(tok)
    if kind == "wordpiece":
        pieces = _wordpiece_merges(words, specials, size=400)
        tok.model = models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token=unk)
    else:
        # Words scored by log frequency, characters below any word (unseen words split into characters).
        total = sum(words.values())
        scores = {t: 0.0 for t in specials} | {w: math.log(n / total) for w, n in words.items()}
        scores |= {c: math.log(1 / total) - 5.0 for c in sorted({c for w in words for c in w}) if c not in scores}
        tok.model = models.Unigram(list(scores.items()), unk_id=specials.index(unk))
    return tok


def _wordpiece_merges(words: Counter[str], specials: list[str], size: int) -> list[str]:
    """What WordPieceTrainer learns (BPE merges over the words, "##" marking a continuation) up to `size`
    pieces, with ties broken by the pieces' order instead of a hash map's."""
    split = {w: [w[0], *("##" + c for c in w[1:])] for w in words}
    vocab = dict.fromkeys([*specials, *sorted({p for pieces in split.values() for p in pieces})])
    while len(vocab) < size:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, n in words.items():
            for pair in itertools.pairwise(split[w]):
                pairs[pair] += n
        if not pairs:
            break
        a, b = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merged = a + b.removeprefix("##")
        for pieces in split.values():
            i = 0
            while i < len(pieces) - 1:
                if (pieces[i], pieces[i + 1]) == (a, b):
                    pieces[i : i + 2] = [merged]
                i += 1
        vocab[merged] = None
    return list(vocab)


def _corpus_words(tok: Tokenizer) -> Counter[str]:
    """The corpus's words as `tok`'s normalizer and pre-tokenizer cut them, most frequent first."""
    normalize = tok.normalizer.normalize_str if tok.normalizer else str
    words = Counter(w for line in CORPUS for w, _ in tok.pre_tokenizer.pre_tokenize_str(normalize(line)))
    return Counter(dict(sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))))


def _wordpiece() -> Tokenizer:
    """BERT's tokenizer (WordPiece with [CLS]/[SEP]), for tests of tokenizer-level behaviour."""
    tok = _tokenizer("wordpiece", SPECIALS["bert"])
    _post_processor(tok, "bert")
    return tok


def _post_processor(tok: Tokenizer, specials: str) -> None:
    if specials == "decoder":
        eos = ("<|endoftext|>", tok.token_to_id("<|endoftext|>"))
        tok.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1", special_tokens=[eos]
        )
    elif specials == "bert":
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        )


def _save_tokenizer(family: Family, folder: Path, answers: bool = True) -> dict[str, int]:
    """Train the family's tokenizer and save it as transformers does; returns the special token ids."""
    from transformers import PreTrainedTokenizerFast

    tok = _tokenizer(family.tokenizer, SPECIALS[family.specials])
    _post_processor(tok, family.specials)
    side = "right"
    if family.specials == "decoder":
        if answers:
            tok.add_tokens(["yes", "no"])  # what an LM reranker scores (whole tokens in Qwen's real vocabulary)
        specials = dict(eos_token="<|endoftext|>", pad_token="<|endoftext|>")
        side = "left"
    elif family.specials == "bert":
        specials = dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    else:
        specials = dict(
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
            pad_token="<pad>",
            cls_token="<s>",
            sep_token="</s>",
            mask_token="<mask>",
        )
    # What the model's forward() is fed by transformers' own pipelines: token_type_ids only with segments.
    names = ["input_ids", "attention_mask", *(["token_type_ids"] if family.segments else [])]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=MAX_POSITIONS - 2,
        model_input_names=names,
        padding_side=side,
        **specials,
    )
    fast.save_pretrained(str(folder))
    ids = {name: i for name, token in specials.items() if (i := tok.token_to_id(token)) is not None}
    return ids | {"vocab_size": int(tok.get_vocab_size())}


def _config(family: Family, ids: dict[str, int], extra: dict[str, Any]) -> Any:
    import transformers

    special_ids: dict[str, Any] = dict(
        vocab_size=ids["vocab_size"],
        pad_token_id=ids["pad_token"],
        bos_token_id=ids.get("bos_token", ids.get("cls_token", ids["pad_token"])),
        eos_token_id=ids.get("eos_token", ids.get("sep_token", ids["pad_token"])),
    )
    if family.model_type == "modernbert":
        special_ids |= dict(cls_token_id=ids["cls_token"], sep_token_id=ids["sep_token"])
    if family.model_type == "gemma4_text":  # its per-layer embeddings default to Gemma's 262k vocabulary
        special_ids |= dict(vocab_size_per_layer_input=ids["vocab_size"])
    if family.model_type == "modernvbert":  # the text model (ModernBERT) reads its own ids and vocabulary
        text = special_ids | dict(cls_token_id=ids["cls_token"], sep_token_id=ids["sep_token"], model_type="modernbert")
        special_ids["text_config"] = dict(family.config["text_config"]) | text
        special_ids["image_token_id"] = ids["image_token"]
    if family.model_type == "t5gemma2":  # an encoder (text and vision) and a decoder, each with its own ids
        encoder = family.config["encoder"]
        special_ids["encoder"] = encoder | {"text_config": encoder["text_config"] | special_ids}
        special_ids["decoder"] = family.config["decoder"] | special_ids
    # The caller's keys win over the family's (a bigger geometry for measurements, another label set).
    merged = {"max_position_embeddings": MAX_POSITIONS, **family.config, **special_ids, **extra}
    return transformers.AutoConfig.for_model(family.model_type, **merged)


HEADS = {
    "text-classification": ("AutoModelForSequenceClassification", CLASS_LABELS),
    "token-classification": ("AutoModelForTokenClassification", NER_LABELS),
    "text-ranking": ("AutoModelForSequenceClassification", ["relevance"]),
    "feature-extraction": ("AutoModel", []),
}


def make_model(folder: Path, task: str, arch: str = "bert", seed: int = 0, **config: Any) -> Path:
    """Write a tiny random `arch` model for `task` to `folder` (weights as safetensors)."""
    import torch
    import transformers

    family = FAMILIES.get(arch) or REFUSED[arch]
    folder.mkdir(parents=True, exist_ok=True)
    ids = _save_tokenizer(family, folder)
    if family.model_type == "modernvbert":
        ids |= _save_image_processor(folder)
    if family.model_type == "t5gemma2":
        ids |= _save_gemma3_processor(folder)
    auto, labels = HEADS[task]
    if family.model_type == "t5gemma2" and task == "feature-extraction":
        # Saved as its checkpoints are, the LM's (weights under "model."), which is where sentence-transformers
        # reads the encoder from.
        auto = "AutoModelForSeq2SeqLM"
    extra: dict[str, Any] = {}
    if labels:
        extra = {"id2label": dict(enumerate(labels)), "label2id": {v: i for i, v in enumerate(labels)}}
    if task == "text-ranking" and family.specials != "decoder":
        # At the default 0.02 a random encoder ranker scores a query's documents within 1e-7 of each other, so
        # their order (what the Spearman gate checks) came from float rounding; 0.2 sets them 1e-3 or more apart.
        extra["initializer_range"] = 0.2
    extra |= config  # the caller's configuration wins (another label set, sentence-transformers keys...)
    torch.manual_seed(seed)
    model = getattr(transformers, auto).from_config(_config(family, ids, extra)).eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    if task == "feature-extraction":
        _sentence_transformers_files(folder, decoder=family.specials == "decoder")
    return folder


def _save_image_processor(folder: Path) -> dict[str, int]:
    """ModernVBERT's processor (Idefics3's), as its checkpoints ship one: sentence-transformers loads a
    multimodal model through it. It adds its image tokens to the tokenizer; returns the new ids."""
    from transformers import AutoTokenizer, Idefics3ImageProcessor, Idefics3Processor

    images = Idefics3ImageProcessor(size={"longest_edge": 32}, max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(images, AutoTokenizer.from_pretrained(str(folder)), image_seq_len=4)
    processor.save_pretrained(str(folder))
    return {"vocab_size": len(processor.tokenizer), "image_token": processor.image_token_id}


def make_gemma4(folder: Path, seed: int = 0) -> Path:
    """A Gemma 4 checkpoint as released: the multimodal wrapper (model_type gemma4, Gemma4Model) around the
    tiny gemma4_text model, with no vision or audio tower, saved as a feature-extraction folder. Its
    processor needs torchvision, which the tests do not install, so sentence-transformers cannot load it:
    compare against transformers."""
    import torch
    import transformers

    family = FAMILIES["gemma4_text"]
    folder.mkdir(parents=True, exist_ok=True)
    ids = _save_tokenizer(family, folder)
    text = _config(family, ids, {}).to_dict()
    config = transformers.AutoConfig.for_model(
        "gemma4", text_config=text, vision_config=None, audio_config=None, pad_token_id=ids["pad_token"]
    )
    torch.manual_seed(seed)
    transformers.AutoModel.from_config(config).eval().save_pretrained(str(folder), safe_serialization=True)
    _sentence_transformers_files(folder, decoder=True)
    return folder


def _save_gemma3_processor(folder: Path) -> dict[str, int]:
    """T5Gemma 2's processor (Gemma 3's), as its checkpoints ship one: sentence-transformers loads the model
    through it. Its tokenizer names the image markers (begin, soft token, end), added here; returns the
    vocabulary size with them."""
    from transformers import AutoTokenizer, Gemma3ImageProcessor, Gemma3Processor

    markers = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}
    tokenizer = AutoTokenizer.from_pretrained(str(folder), extra_special_tokens=markers)
    images = Gemma3ImageProcessor(size={"height": 32, "width": 32})
    processor = Gemma3Processor(images, tokenizer, image_seq_length=4)
    processor.save_pretrained(str(folder))
    return {"vocab_size": len(tokenizer)}  # the markers' ids matter only to images, which hare does not take


def make_lm_reranker(folder: Path, arch: str = "qwen3", seed: int = 0, answers: bool = True) -> Path:
    """A Qwen3-Reranker-shaped folder: a causal LM (`arch`ForCausalLM) whose "yes"/"no" tokens score pairs.
    Its tokenizer appends nothing (Qwen3-Reranker's post-processor is plain byte-level); without `answers`
    it has no "yes"/"no" tokens, as an LM that is no reranker."""
    import torch
    import transformers

    family = FAMILIES[arch]
    folder.mkdir(parents=True, exist_ok=True)
    ids = _save_tokenizer(family, folder, answers)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(folder / "tokenizer.json"))
    # Room for the card's chat template, which this tiny vocabulary spells in about 150 tokens.
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"model_max_length": LM_POSITIONS}))
    torch.manual_seed(seed)
    lm = _config(family, ids, {"max_position_embeddings": LM_POSITIONS})
    model = transformers.AutoModelForCausalLM.from_config(lm).eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def _sentence_transformers_files(folder: Path, decoder: bool = False) -> None:
    """modules.json + 1_Pooling, as sentence-transformers writes them (mean pooling, then Normalize); decoders
    as Qwen3-Embedding: last-token pooling and named prompts, the query prompt by default."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    # Every key spelled out, as sentence-transformers saves them (a key left out takes its default: mean on).
    pooling = {"pooling_mode_mean_tokens": not decoder, "pooling_mode_lasttoken": decoder, "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    if decoder:
        prompts = {"prompts": DECODER_PROMPTS, "default_prompt_name": "query", "similarity_fn_name": "cosine"}
        (folder / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))


def make_sentence_transformer(
    folder: Path,
    base: Path,
    pooling: str = "mean",
    dense: Sequence[int] = (),
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
) -> Path:
    """A sentence-transformers folder saved by sentence-transformers itself: the transformer at `base`, then
    Pooling(`pooling`), a Dense module (tanh, its default activation) per size in `dense`, and Normalize."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    transformer = models.Transformer(str(base))
    modules: list[Any] = [transformer, models.Pooling(transformer.get_embedding_dimension(), pooling)]
    width = transformer.get_embedding_dimension()
    torch.manual_seed(1)
    for size in dense:
        modules.append(models.Dense(width, size))
        width = size
    if normalize:
        modules.append(models.Normalize())
    model = SentenceTransformer(modules=modules, prompts=prompts, default_prompt_name=default_prompt_name, device="cpu")
    model.save(str(folder))
    return folder


REMOTE_CONFIG = """from transformers import BertConfig


class XConfig(BertConfig):
    model_type = "hare-custom"
"""
REMOTE_MODELING = """from pathlib import Path

from transformers import BertForSequenceClassification

from .configuration_x import XConfig

# Proof of where this code runs: every import leaves a line in the marker file.
with Path({marker!r}).open("a") as log:
    log.write("imported\\n")


class XForSequenceClassification(BertForSequenceClassification):
    config_class = XConfig

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **kwargs):
        out = super().forward(input_ids, attention_mask, token_type_ids, **kwargs)
        out.logits = out.logits * 3.0  # the custom code changes the answers, so parity shows it ran
        return out
"""


def make_remote_code_model(folder: Path, marker: Path) -> Path:
    """A classifier whose classes live in the folder's own code (configuration_x.py, modeling_x.py, reached
    through config.json's auto_map), as NomicBERT or Jina checkpoints ship theirs. Importing modeling_x
    appends a line to `marker`."""
    make_model(folder, "text-classification", "bert")
    (folder / "configuration_x.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_x.py").write_text(REMOTE_MODELING.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config |= {
        "model_type": "hare-custom",
        "architectures": ["XForSequenceClassification"],
        "auto_map": {
            "AutoConfig": "configuration_x.XConfig",
            "AutoModelForSequenceClassification": "modeling_x.XForSequenceClassification",
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def make_sentencepiece_model(folder: Path, task: str = "text-classification") -> Path:
    """A DeBERTa-v3-style folder with only a SentencePiece `spm.model` (no tokenizer.json), trained here:
    [PAD]=0, [CLS]=1, [SEP]=2, [UNK]=3 as deberta-v3-base has them; hare must convert it at optimize time."""
    import io

    import sentencepiece as spm
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_writer=proto,
        vocab_size=300,
        model_type="unigram",
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        pad_piece="[PAD]",
        bos_piece="[CLS]",
        eos_piece="[SEP]",
        unk_piece="[UNK]",
        user_defined_symbols=["[MASK]"],
        minloglevel=2,
    )
    (folder / "spm.model").write_bytes(proto.getvalue())
    # What transformers 4.x's slow DebertaV2Tokenizer saved (transformers 5 has no slow one and would also
    # write a tokenizer.json): the SentencePiece model, tokenizer_config.json and special_tokens_map.json.
    specials = dict(bos_token="[CLS]", eos_token="[SEP]", unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]")
    specials |= dict(cls_token="[CLS]", mask_token="[MASK]")
    tokenizer_config = specials | {
        "do_lower_case": False,
        "split_by_punct": False,
        "vocab_type": "spm",
        "sp_model_kwargs": {},
        "model_max_length": MAX_POSITIONS - 2,
        "tokenizer_class": "DebertaV2Tokenizer",
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    auto, labels = HEADS[task]
    family = FAMILIES["deberta-v2"]
    ids = {"vocab_size": spm.SentencePieceProcessor(model_proto=proto.getvalue()).get_piece_size()}
    ids |= {"pad_token": 0, "cls_token": 1, "sep_token": 2}
    extra = {"id2label": dict(enumerate(labels)), "label2id": {v: i for i, v in enumerate(labels)}} if labels else {}
    torch.manual_seed(0)
    model = getattr(transformers, auto).from_config(_config(family, ids, extra)).eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder
