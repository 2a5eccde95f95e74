"""The test template of docs/kernel-developers.md, run as printed there against a toy
kernel: the first ``--golden-update`` records goldens, a one-ULP change to the kernel's
output fails with a readable ULP report, ``--golden-update`` accepts it and the next run
passes. Bug pinned: a documented template that does not work when copied."""

from __future__ import annotations

import re
from pathlib import Path

pytest_plugins = ["pytester"]
DOC = Path(__file__).resolve().parents[2] / "docs" / "kernel-developers.md"
MARK = "<!-- template: tests/test_my_kernel_golden.py -->"

TOY_KERNEL = """
import os
import torch


def my_kernel(x):
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    if os.environ.get("TOY_KERNEL_ONE_ULP"):  # the "kernel change": every output one ULP up
        out = torch.nextafter(out, torch.full_like(out, float("inf")))
    return out
"""


def template() -> str:
    text = DOC.read_text(encoding="utf-8")
    assert MARK in text, f"{DOC} lost its template marker"
    m = re.search(r"```python\n(.*?)```", text[text.index(MARK) :], re.S)
    assert m is not None
    return m.group(1)


def test_template_imports_the_users_kernel():
    assert "from my_project.kernels import my_kernel" in template()
    assert "golden.check_tensors(" in template() and "from detsample.testing import tensor" in template()


def test_template_records_fails_on_one_ulp_and_accepts(pytester, monkeypatch):
    for var in ("CI", "DETSAMPLE_GOLDEN_DIR", "TOY_KERNEL_ONE_ULP"):
        monkeypatch.delenv(var, raising=False)
    pytester.mkpydir("my_project")
    (pytester.path / "my_project" / "kernels.py").write_text(TOY_KERNEL)
    pytester.mkdir("tests")
    (pytester.path / "tests" / "test_my_kernel_golden.py").write_text(template())
    pytester.syspathinsert()

    def run(*args: str):
        r = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args, "tests")
        return int(r.ret), r.stdout.str()

    rc, out = run()
    assert rc == 0 and "5 skipped" in out and "SKIPPED, NOT passed" in out
    rc, out = run("--golden-update")
    assert rc == 0 and out.count("[new] my_kernel.") == 5, out
    (folder,) = (pytester.path / "golden").glob("cpu-*/tensors")
    assert {p.name for p in folder.iterdir()} == {
        f"my_kernel.{c}" for c in ("random-f32", "ties-f32", "huge-bf16", "nan-f16", "large-f32")
    }
    assert (folder / "my_kernel.large-f32" / "out.bin").is_file()
    assert run()[0] == 0

    monkeypatch.setenv("TOY_KERNEL_ONE_ULP", "1")
    rc, out = run()  # nan-f16 passes: its outputs are all NaN, and nextafter(NaN) is NaN
    assert rc == 1 and "4 failed, 1 passed" in out
    assert "my_kernel.random-f32: 1 of 2 tensors differ: out (256 of 256 elements moved)" in out
    assert "ULP histogram (float32 ULPs): 1: 256" in out
    assert re.search(r"first moved element: \[0,0\]: 0x[0-9a-f]{8} \(\S+\) -> 0x[0-9a-f]{8} \(\S+\), 1 ulp", out)
    assert "out: float32 [64, 512]: 32768 of 32768 elements moved" in out
    rc, out = run("--golden-update")
    assert rc == 0 and out.count("[moved] my_kernel.") == 4 and "5 goldens written, 4 changed" in out
    assert run()[0] == 0
