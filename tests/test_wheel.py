"""An installed wheel works without the repository (issue 11, deliverable 1).

The wheel is built from a copy of the sources (the checkout stays untouched), installed
without dependencies into a fresh virtual environment whose only link to this one is a
``.pth`` line to its site-packages (numpy, pandas, ... -- not calib, whose editable
finder that directory's own ``.pth`` files would install: a ``.pth`` path line does not
process them), and run from a directory outside the repository: the demo's data and the
published tables come from the wheel's package data (:mod:`calib.core.bundled`).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("calib", "ingest", "calibrate", "analytic", "reports", "fixtures", "pyproject.toml", "README.md")

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import calib
    from calib.core.bundled import fixtures_dir, published_dir
    from calib.demo_pipeline import RUNS

    site = Path(sys.argv[1])
    assert Path(calib.__file__).is_relative_to(site), calib.__file__
    fx = fixtures_dir()
    assert fx == site / "calib" / "fixtures", fx
    missing = [p for r in RUNS for p in r.paths if not (fx / p).exists()]
    assert not missing, missing
    run = calib.ingest_run(fx / "nccl-tests" / "polaris", system="polaris", store="store")
    model = calib.SystemModel().fit(calib.load_runs(system="polaris", store="store"))
    bw = model.busbw("allreduce", 32)
    pred = model.predict("gpt-1.3b", gpus=[8, 64], zero=1, micro_batch=1, global_batch=512)
    val = calib.validate(published_dir() / "megatron_sc21_table1_weak_scaling.csv", calibrate_on="1,4,7,10")
    print(f"busbw {bw.value:.1f} GB/s; {len(pred.table)} predictions; {len(val.rows)} validation rows")
    """
)


def _tooling() -> str | None:
    for mod in ("pip", "setuptools", "venv"):
        if importlib.util.find_spec(mod) is None:
            return mod
    return None


def test_installed_wheel_runs_the_pipeline_outside_the_repository(tmp_path: Path) -> None:
    missing = _tooling()
    if missing:
        pytest.skip(f"cannot build a wheel here: no '{missing}' module in {sys.executable}")
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(p, src / name)
    py = sys.executable
    run = {"check": True, "capture_output": True, "text": True, "timeout": 120}
    subprocess.run([py, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)], **run)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("calib-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"calib", wheel.name.split("-py3")[0] + ".dist-info"}
    venv = tmp_path / "venv"
    subprocess.run([py, "-m", "venv", "--without-pip", str(venv)], **run)
    vpy = venv / "bin" / "python"
    subprocess.run([py, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-deps", "--no-index", str(wheel)], **run)  # fmt: skip
    site = Path(subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], **run).stdout.strip())  # fmt: skip
    (site / "calib_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPLBACKEND": "Agg"}
    out = subprocess.run([vpy, "-c", SCRIPT, str(site)], cwd=work, env=env, **{**run, "check": False})
    assert out.returncode == 0 and "predictions" in out.stdout, out.stdout + out.stderr
    # the console script of the wheel finds a bundled published table by its bare name
    table = "megatron_sc21_table1_weak_scaling.csv"
    out = subprocess.run([venv / "bin" / "calib", "validate", table, "--calibrate-on", "1,4,7,10", "--json"], cwd=work, env=env, **run)  # fmt: skip
    doc = json.loads(out.stdout)  # the 10 rows of the bundled table (SC21 Table 1), predicted
    assert Path(doc["table"]).parent == site / "calib" / "fixtures" / "published" and doc["rows"] == 10
    out = subprocess.run([venv / "bin" / "calib", "demo", "--help"], cwd=work, env=env, **run)
    assert "CALIB_FIXTURES" in out.stdout
