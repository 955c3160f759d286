"""``pip install 'agentfn-asgi[server]'`` then ``agentfn-asgi demo`` works in an empty folder.

The wheel is built from this checkout, installed with the ``server`` extra into a fresh,
isolated virtual environment (no system site-packages, nothing of the checkout on its
path), and the demo runs from an empty temporary folder: real uvicorn processes, the same
timeline, exit 0.

Dependencies are pinned to the versions of the test environment and kept in a wheelhouse in
pytest's cache: the first run downloads them from the package registry, later runs install
offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(command: list[str], *, cwd: Path | None = None, timeout: float = 300) -> str:
    done = subprocess.run(
        command,
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _clean_env() -> dict[str, str]:
    """This environment without anything that would lead a child back to the checkout."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _build_wheel(dist: Path) -> Path:
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    _run([*pip_wheel, "-q", "-w", str(dist), str(ROOT)])
    [wheel] = dist.glob("agentfn_asgi-*.whl")
    return wheel


def _install(venv: Path, wheel: Path, wheelhouse: Path, constraints: Path) -> None:
    """Install ``wheel[server]``: offline from the wheelhouse when it has everything,
    otherwise after downloading what is missing into it."""
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    target = f"{wheel}[server]"
    offline = [*pip, "install", "-q", "--no-index", "--find-links", str(wheelhouse)]
    offline += ["-c", str(constraints), target]
    done = subprocess.run(offline, env=_clean_env(), capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return
    download = [*pip, "download", "-q", "--only-binary=:all:", "-d", str(wheelhouse)]
    _run([*download, "-c", str(constraints), target])
    for ours in wheelhouse.glob("agentfn_asgi-*.whl"):
        ours.unlink()  # a copy of the wheel under test: only the dependencies are kept
    _run(offline)


@pytest.mark.slow
def test_the_demo_runs_from_an_installed_wheel_in_an_empty_folder(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The wheel carries the demo's app and tools (and no examples or tests); installed
    with the ``server`` extra into a fresh venv, ``agentfn-asgi demo`` run from an empty
    folder exits 0 with the whole timeline, using the installed package, and leaves the
    folder empty."""
    wheel = _build_wheel(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for shipped in ("demo/app.py", "demo/tools.py", "py.typed"):
        assert f"agentfn_asgi/{shipped}" in names
    assert not any(name.startswith(("examples/", "tests/")) for name in names)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    try:
        constraints = tmp_path / "constraints.txt"
        frozen = _run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"])
        constraints.write_text(
            "\n".join(line for line in frozen.splitlines() if " @ " not in line) + "\n"
        )
        # Kept across runs in pytest's cache (offline after the first); a fresh folder when
        # the cache plugin is off.
        cache = getattr(request.config, "cache", None)
        wheelhouse = cache.mkdir("wheelhouse") if cache is not None else tmp_path / "wheels"
        _install(venv, wheel, wheelhouse, constraints)

        empty = tmp_path / "empty"
        empty.mkdir()
        python = str(venv / "bin" / "python")
        where = "import agentfn_asgi; print(agentfn_asgi.__file__)"
        location = _run([python, "-c", where], cwd=empty)
        assert Path(location.strip()).is_relative_to(venv)

        output = _run([str(venv / "bin" / "agentfn-asgi"), "demo"], cwd=empty, timeout=120)
        for stage in (
            "starting agentfn_asgi.demo.app:app (uvicorn)",
            "delivery verified and recorded",
            "handler    get_customer",
            "claimed    lookup_invoice  call_unknown     no handler registered",
            "saved      create_refund   call_bad_refund  failed (tool_error)",
            "step 2 asks for 1 call(s)",
            "turn completed, session idle",
            "ledger: 1 refund line(s) written",
            "demo passed",
        ):
            assert stage in output, output
        assert list(empty.iterdir()) == []
    finally:
        shutil.rmtree(venv, ignore_errors=True)
