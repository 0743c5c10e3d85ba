"""Tiny, locally built models and tokenizers: for the demo, the tests and the benchmarks.

Nothing here downloads. A tokenizer is a byte-level BPE trained on the given texts, with
a ChatML chat template (Qwen style, ``<think>`` aware); models are random-weight
``from_config`` instances of real Hugging Face architectures.
"""

from __future__ import annotations

from collections.abc import Iterable

from loopeval.evaluation.settings import THINK_CLOSE, THINK_OPEN

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = [THINK_OPEN, THINK_CLOSE]  # added tokens that decode as text, as in Qwen3

# ChatML, as Qwen uses it. `enable_thinking=True` leaves the assistant turn open at
# "<think>\n"; otherwise an empty thinking block is written, as Qwen3 does.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking %}{{ '<think>\n' }}"
    "{% endif %}{% endif %}"
)

_DEFAULT_TEXTS = [
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) { } \\boxed",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "Tom has 3 apples and buys 4 more. How many apples does he have? 3 + 4 = 7. \\boxed{7}",
    "A train travels 60 miles in 1.5 hours; its speed is 40 miles per hour.",
    # the budget-forcing strings (loopeval.evaluation.decoding), so they cost few tokens
    "Considering the limited time by the user, I have to give the solution based on the thinking directly now.",
    "Considering the limited time, I have to give the final answer now.\nThe final answer is \\boxed{",
]


def tiny_tokenizer(texts: Iterable[str] | None = None, *, vocab_size: int = 512):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts`` (default: a few sentences)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits one by one, as Qwen's tokenizers split numbers: arithmetic stays learnable.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts) if texts is not None else _DEFAULT_TEXTS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.add_tokens(THINK_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


ARCHITECTURES = ("qwen3", "llama", "qwen3_5", "qwen3_sliding", "qwen2", "mistral", "qwen3_next", "gemma3")


def tiny_config(arch: str = "qwen3", *, vocab_size: int = 512, num_layers: int = 6, hidden: int = 64, **overrides):
    """A small config of a real architecture. ``qwen3_5`` and ``qwen3_next`` are the hybrid
    Gated DeltaNet models (``qwen3_next`` with mixture-of-experts MLPs); ``mistral`` and
    ``qwen3_sliding`` have sliding-window attention (window 8); ``gemma3`` is Gemma 3's
    text model with sliding-window layers (window 4) and a global layer every third
    (layers 2, 5, ..., as the real models' every sixth)."""
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=2,
    )
    gated_deltanet = dict(
        head_dim=hidden // 4,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
    )
    if arch == "qwen3":
        from transformers import Qwen3Config

        cfg = Qwen3Config(head_dim=hidden // 4, **common)
    elif arch == "qwen3_sliding":
        from transformers import Qwen3Config

        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
        cfg = Qwen3Config(head_dim=hidden // 4, use_sliding_window=True, sliding_window=8, layer_types=types, **common)
    elif arch == "llama":
        from transformers import LlamaConfig

        cfg = LlamaConfig(**common)
    elif arch == "qwen2":
        from transformers import Qwen2Config

        cfg = Qwen2Config(**common)
    elif arch == "mistral":
        from transformers import MistralConfig

        cfg = MistralConfig(head_dim=hidden // 4, sliding_window=8, **common)
    elif arch == "qwen3_next":
        from transformers import Qwen3NextConfig

        cfg = Qwen3NextConfig(
            **gated_deltanet,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=hidden // 2,
            shared_expert_intermediate_size=hidden // 2,
            **common,
        )
    elif arch == "qwen3_5":
        from transformers import Qwen3_5TextConfig

        cfg = Qwen3_5TextConfig(**gated_deltanet, **common)
    elif arch == "gemma3":
        from transformers import Gemma3TextConfig

        types = ["full_attention" if i % 3 == 2 else "sliding_attention" for i in range(num_layers)]
        cfg = Gemma3TextConfig(head_dim=hidden // 4, query_pre_attn_scalar=hidden // 4, sliding_window=4,
                               layer_types=types, **common)
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def tiny_model(arch: str = "qwen3", *, seed: int = 0, attn_implementation: str | None = None, **config_kwargs):
    """A random-weight causal LM of ``tiny_config(arch, **config_kwargs)``, in float32 eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        tiny_config(arch, **config_kwargs), dtype=torch.float32, attn_implementation=attn_implementation
    )
    return model.eval()
