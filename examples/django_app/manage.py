"""Django's command-line utility for the example project (run from the repository root)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    """Run a Django management command with the example's settings."""
    # The settings module is ``examples.django_app...``: the repository root must be importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.exampleproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
