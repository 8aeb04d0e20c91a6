"""Real-browser widget check: JupyterLab + Debian chromium driven by Playwright.

Opens a notebook in JupyterLab, runs all cells and waits until the ipywidgets slider
(``.widget-slider``) and a coloured trace span (``.mk-span``) are rendered. A small probe
notebook built here checks the machinery itself; ``00_tour.ipynb`` is the real target.

Needs ``apt-get install -y chromium`` and ``pip install playwright`` (never run
``playwright install``: it downloads a browser and fails offline). Screenshots go to
``test-artifacts/browser_<notebook>.png``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from nbtools import NOTEBOOKS_DIR, REPO, make_notebook

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = REPO / "test-artifacts"
PROBE = "_widget_probe.ipynb"
TREE_PROBE = "_tree_probe.ipynb"
RUN_TIMEOUT_MS = 150_000

PROBE_CELLS = [
    "import ipywidgets as w\nfrom IPython.display import display\n"
    "display(w.IntSlider(value=2, min=0, max=5, description='turn'))",
    'display(w.HTML(\'<span class="mk-span" style="background:#fdd">&lt;mem&gt;</span> rest\'))',
]


TREE_CELLS = [  # a query's memory operation trees from the teacher (byte tokenizer: no model, seconds)
    "from memkit.agents.base import OracleConfig\nfrom memkit.agents.memt import MemT\n"
    "from memkit.lab.kit import _ByteTokenizer\nfrom memkit.rl.mot import score_query\n"
    "from memkit.rollout.engine import OraclePolicy, RolloutConfig\nfrom memkit.rollout.streams import build_memories\n"
    "from memkit.rollout.trees import TreeConfig, grow_trees\nfrom memkit.viz import TreeViewer\n"
    "from memkit.world import make_world, make_conversation\n"
    "m, tok, cfg = MemT(), _ByteTokenizer(), RolloutConfig(max_context_tokens=10**9)\n"
    "conv = make_conversation(make_world(0), 0, 'smoke')\n"
    "pol = OraclePolicy(m, tok, OracleConfig(p_wasted_search=0.5, p_wrong_answer=0.3))\n"
    "(built,) = build_memories(m, [conv], pol, tok, cfg)\n"
    "qt = grow_trees(m, built, 0, pol, tok, TreeConfig(3, 2, 2), cfg)\n"
    "_ = score_query(qt.trees, conv.qa[0].evidence, built.memory['store'].sources_of())",
    "TreeViewer(qt.trees)",
]


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return "/usr/bin/chromium is missing: apt-get install -y chromium"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is missing: pip install playwright (do not run `playwright install`)"
    return None


if _missing():
    pytest.skip(_missing(), allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 serving a temp copy of notebooks/ plus the probe notebook."""
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "notebooks"
    if NOTEBOOKS_DIR.is_dir():
        shutil.copytree(NOTEBOOKS_DIR, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    make_notebook(root / PROBE, PROBE_CELLS)
    make_notebook(root / TREE_PROBE, TREE_CELLS)
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
        MEMKIT_RECORD_PATH=str(tmp / "records.json"),
        MEMKIT_FIGURES=str(tmp / "figures"),
    )
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    log_path = tmp / "lab.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("JupyterLab did not start:\n" + log_path.read_text(errors="replace")[-3000:])
            time.sleep(0.5)
        yield {"base": base, "token": token, "root": root, "log": log_path}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _started(page) -> bool:
    """True once any cell shows an execution prompt ("[*]" or "[1]")."""
    return page.evaluate(
        "() => [...document.querySelectorAll('.jp-InputPrompt')].some(e => /\\[(\\*|\\d+)\\]/.test(e.textContent))"
    )


def _run_all(page) -> None:
    """Run > Run All Cells through the menu bar, as a student would (retried once)."""
    for _ in range(2):
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if _started(page):
                return
            page.wait_for_timeout(250)
        page.keyboard.press("Escape")
    raise AssertionError("Run > Run All Cells did not start any cell")


def _open_and_run(lab, page, name: str) -> None:
    """Open ``name`` in a fresh workspace, wait for the kernel, Run All Cells."""
    workspace = Path(name).stem.strip("_").replace("_", "-")
    page.goto(f"{lab['base']}/lab/workspaces/{workspace}/tree/{name}?reset&token={lab['token']}", timeout=90_000)
    page.wait_for_selector(".jp-Notebook", timeout=90_000)
    page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for(timeout=90_000)
    _run_all(page)


def test_tree_viewer_responds_to_a_click(lab, browser):
    """The tree viewer renders in JupyterLab, and a click on a node button shows that node."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        _open_and_run(lab, page, TREE_PROBE)
        page.wait_for_selector(".mk-tree-node", timeout=RUN_TIMEOUT_MS)
        page.wait_for_selector(".mk-tree-svg circle", timeout=RUN_TIMEOUT_MS)
        buttons = page.locator(".mk-tree-node")
        assert buttons.count() >= 3
        target = buttons.nth(2)
        label = target.inner_text().strip()  # "node <i>"
        target.click()
        page.wait_for_function(
            "label => [...document.querySelectorAll('.mk-tree-detail')].some(e => e.textContent.includes(label + ' '))"
            " && [...document.querySelectorAll('.mk-tree-detail')].some(e => e.textContent.includes('A_inter'))",
            arg=label,
            timeout=60_000,
        )
    finally:
        page.screenshot(path=str(ARTIFACTS / "browser_tree_probe.png"), full_page=False)
        page.close()


@pytest.mark.parametrize("name", [PROBE, "00_tour.ipynb"])
def test_widgets_render_in_jupyterlab(lab, browser, name):
    if not (lab["root"] / name).exists():
        pytest.skip(f"notebooks/{name} does not exist yet")
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"browser_{Path(name).stem.lstrip('_')}.png"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        # a fresh workspace per notebook: Lab would otherwise restore the previous test's tabs
        workspace = Path(name).stem.strip("_").replace("_", "-")
        page.goto(f"{lab['base']}/lab/workspaces/{workspace}/tree/{name}?reset&token={lab['token']}", timeout=90_000)
        page.wait_for_selector(".jp-Notebook", timeout=90_000)
        current = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")
        current.first.wait_for(timeout=90_000)
        assert name in current.first.inner_text(), f"the open tab is {current.first.inner_text()!r}, not {name}"
        # the kernel must be up before Run All: the status bar reads "<kernel> | Idle"
        page.locator(".jp-StatusBar-Widget", has_text="| Idle").first.wait_for(timeout=90_000)
        _run_all(page)
        page.wait_for_selector(".widget-slider", timeout=RUN_TIMEOUT_MS)
        page.wait_for_selector(".mk-span", timeout=RUN_TIMEOUT_MS)
        page.wait_for_function(  # all cells finished: no "[*]" prompt left
            "() => ![...document.querySelectorAll('.jp-InputPrompt')].some(e => e.textContent.includes('*'))",
            timeout=RUN_TIMEOUT_MS,
        )
        # Lab 4 renders tracebacks as stderr text; tell them from warnings by their header
        stderr = page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        ).all_inner_texts()
        errors = [t for t in stderr if "Traceback (most recent call last)" in t]
        assert not errors, f"{name}: cells raised:\n" + "\n".join(e[-1500:] for e in errors)
        assert page.locator(".widget-slider").first.is_visible()
    finally:
        page.screenshot(path=str(shot), full_page=False)
        page.close()
