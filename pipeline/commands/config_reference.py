"""`python -m pipeline config-reference`: every config key as Markdown (docs/configuration.md)."""
from __future__ import annotations

from pipeline.errors import UserError

HELP = {"-h", "--help"}


def main(args: list[str]) -> int:
    from pipeline.config import reference

    if HELP.intersection(args):
        print(f"usage: python -m pipeline config-reference\n\nPrints {reference.PAGE} (Markdown); "
              f"regenerate the page with: {reference.REGENERATE}")
        return 0
    if args:
        raise UserError(f"config-reference: takes no arguments (got {' '.join(args)})")
    print(reference.markdown(), end="")
    return 0
