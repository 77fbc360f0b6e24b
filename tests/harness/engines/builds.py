"""Where the engine builds are: the three scripts' ``--check`` (or the environment)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.builds import built

__all__ = ["LLAMACPP_SCRIPT", "MODEL_SCRIPT", "VLLM_SCRIPT", "Builds", "EngineBuildError", "locate"]

HERE = Path(__file__).resolve().parent
VLLM_SCRIPT = HERE / "vllm" / "build.sh"
LLAMACPP_SCRIPT = HERE / "llamacpp" / "build.sh"
MODEL_SCRIPT = HERE / "tinyllama" / "build.sh"


class EngineBuildError(RuntimeError):
    """An engine or the tiny model is not built (or is out of date)."""


@dataclass(frozen=True)
class Builds:
    vllm: Path
    """The venv's ``vllm`` command."""
    llama_server: Path
    tiny_hf: Path
    """The tiny Llama as a Hugging Face folder (vLLM serves it)."""
    tiny_gguf: Path
    """The same model as an f32 GGUF file (llama.cpp serves it)."""


def locate_vllm() -> tuple[Path, Path]:
    """vLLM's command and the tiny model's HF folder."""
    vllm = built(VLLM_SCRIPT, {"VLLM": "GPUTALLY_VLLM"}, what="vLLM (CPU)", cost="about 4 min", error=EngineBuildError)
    model = built(MODEL_SCRIPT, {"TINY_HF": "GPUTALLY_TINY_HF"}, what="the tiny Llama", cost="about 1 min", error=EngineBuildError)
    return vllm["VLLM"], model["TINY_HF"]


def locate_llamacpp() -> tuple[Path, Path]:
    """llama-server and the tiny model's GGUF file."""
    server = built(LLAMACPP_SCRIPT, {"LLAMA_SERVER": "GPUTALLY_LLAMA_SERVER"}, what="llama.cpp's llama-server",
                   cost="about 10 min", error=EngineBuildError)
    model = built(MODEL_SCRIPT, {"TINY_GGUF": "GPUTALLY_TINY_GGUF"}, what="the tiny Llama", cost="about 1 min", error=EngineBuildError)
    return server["LLAMA_SERVER"], model["TINY_GGUF"]


def locate() -> Builds:
    """Everything the engine tests run."""
    vllm, tiny_hf = locate_vllm()
    llama_server, tiny_gguf = locate_llamacpp()
    return Builds(vllm, llama_server, tiny_hf, tiny_gguf)
