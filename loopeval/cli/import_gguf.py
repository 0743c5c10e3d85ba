"""``loopeval import-gguf``."""

from __future__ import annotations


def add(sub) -> None:
    p = sub.add_parser(
        "import-gguf",
        help="write a GGUF model file as a float Hugging Face checkpoint folder",
        description="Dequantises the GGUF file with transformers and saves config, safetensors weights, tokenizer "
        "and chat template (when the GGUF has one: a warning says when not), a folder every loopeval command "
        "and lm_eval --model looped take.",
    )
    p.add_argument("file", help="the .gguf file")
    p.add_argument("--out", required=True, help="the checkpoint folder to write (must not exist, or be empty)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weight dtype (default: float32, the dequantised weights exactly)")
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from loopeval.core.gguf import IMPORT_RECORD, import_gguf

    out = import_gguf(args.file, args.out, dtype=args.dtype)
    record = json.loads((out / IMPORT_RECORD).read_text())
    print(f"wrote {out} (chat template: {'from the GGUF' if record['chat_template'] else 'none'})")
    return 0
