"""Run llama.cpp's ``convert_hf_to_gguf.py`` on a Hugging Face folder, with a pre-tokenizer mapping.

Executed by the converter's python (``tools/install_llamacpp.sh`` makes one with torch, numpy and
transformers); it imports nothing of this project::

    python gguf_convert.py LLAMA_CPP_SOURCE HF_FOLDER OUT.gguf [PRE_TOKENIZER] --outtype TYPE [--target-model-dir TARGET]

The converter identifies a BPE tokenizer's pre-tokenizer by hashing the ids of a fixed text and
refuses hashes it does not know ("BPE pre-tokenizer was not recognized"). When PRE_TOKENIZER is
given (e.g. ``gpt-2``), an unknown hash maps to it instead; a known hash is never overridden.
The mapping is only safe when llama.cpp then tokenizes exactly like the HF tokenizer: the
llamacpp backend checks token ids on the workload's prompts and refuses a mismatch.
Weights are written as TYPE (f32, f16 or bf16: ``autotune.backends.gguf.quantization``, the
quantized types are made from the f32 file by llama-quantize). An EAGLE-3 head
is converted with ``--target-model-dir`` (the converter reads the target's config and tokenizer).
"""

import os
import sys


def main():
    args = sys.argv[1:]
    target = []
    if "--target-model-dir" in args:
        i = args.index("--target-model-dir")
        target, args = args[i : i + 2], args[:i] + args[i + 2 :]
    i = args.index("--outtype")
    outtype, args = args[i + 1], args[:i] + args[i + 2 :]
    source, model, out = args[:3]
    pre = args[3] if len(args) > 3 else None
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.path[:0] = [os.path.join(source, "gguf-py"), source]
    from conversion import base

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            if pre is None:
                raise
            print(f"gguf_convert: unrecognised BPE pre-tokenizer mapped to {pre!r}", file=sys.stderr)
            return pre

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    import convert_hf_to_gguf

    sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, "--outtype", outtype, *target]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
