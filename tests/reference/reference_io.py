"""What the weight-storage references share: torch and safetensors, or exit 77 (the C++ test then skips)."""
import sys


def torch_and_safetensors():
    """(torch, load_file, save_file), or exit 77 when the reference venv lacks them."""
    try:
        import torch
        from safetensors.torch import load_file, save_file
    except Exception as e:
        print(f"reference unavailable: {e}", file=sys.stderr)
        sys.exit(77)
    return torch, load_file, save_file
