"""The GPU pin sets and their CI check, offline: the sets agree with the package's extras, the CPU test
environment installs with the one-node set, and scripts/check_gpu_pins.py tells "cannot resolve" (fail)
from "registry unreachable" (not checked), end to end against a loopback index and a stand-in uv."""

from __future__ import annotations

import http.server
import importlib.util
import json
import re
import socket
import sys
import threading
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("check_gpu_pins", ROOT / "scripts" / "check_gpu_pins.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_gpu_pins"] = module
    spec.loader.exec_module(module)
    return module


pins = load_script()


def read_pins(path: Path) -> dict[str, Version]:
    result = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not an exact pin"
            result[name.lower()] = Version(version)
    return result


def extras() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}


# -- the sets ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("pin_set", pins.PIN_SETS, ids=lambda s: s.constraints)
def test_every_pin_is_allowed_by_the_extras_the_set_installs(pin_set):
    pinned = read_pins(ROOT / pin_set.constraints)
    requirements = [r for extra in pin_set.extras for r in extras()[extra]]
    checked = 0
    for requirement in requirements:
        name = requirement.name.lower()
        if name in pinned:
            assert requirement.specifier.contains(pinned[name], prereleases=True), (
                f"{pin_set.constraints} pins {name}=={pinned[name]}, outside balcaprl's {requirement}"
            )
            checked += 1
    assert checked >= 2  # the stack's own packages (vllm, trl or verl) are among them


def test_the_sets_hold_the_versions_the_stacks_need():
    one_node = read_pins(ROOT / "constraints/gpu-one-node.txt")
    cluster = read_pins(ROOT / "constraints/gpu-cluster.txt")
    # TRL 1.16 supports vLLM 0.22-0.31; vLLM 0.31 needs transformers < 5.18 and torch 2.13.
    assert one_node["trl"] == Version("1.16.0") and Version("0.22") <= one_node["vllm"] <= Version("0.31")
    assert one_node["transformers"] < Version("5.18") and one_node["torch"] == Version("2.13.0")
    # verl 0.9.1's [vllm] extra: vLLM 0.24.0 with torch 2.11 and transformers 5.9 (verl needs < 5.11).
    assert cluster["verl"] == Version("0.9.1") and cluster["vllm"] == Version("0.24.0")
    assert cluster["transformers"] < Version("5.11") and cluster["torch"] == Version("2.11.0")
    assert "flash-attn" not in cluster  # source-only on PyPI: installed separately (see the file)
    vllm_range = next(r for r in extras()["vllm"] if r.name == "vllm").specifier
    assert Version("0.33.0") not in vllm_range and Version("0.21.0") not in vllm_range


def test_cpu_tests_install_with_the_one_node_set():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^CONSTRAINTS \?= constraints/gpu-one-node.txt$", makefile, re.M)
    setup = makefile.split("$(STAMP):", 1)[1].split("@touch", 1)[0]
    assert "-c $(CONSTRAINTS)" in setup
    # The verl slice: the cluster set less the CUDA-only packages.
    assert re.search(r"^VERL_CONSTRAINTS \?= constraints/gpu-cluster.txt$", makefile, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "timeout 300 python3 scripts/check_gpu_pins.py" in ci


# -- classifying uv's answer ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "returncode, output, status",
    [
        (0, "", "resolved"),
        (
            1,
            "  x No solution found when resolving dependencies:\n  `-> Because vllm==0.31.0 depends on "
            "transformers>=5.10.4,<5.18.0 and you require transformers==5.23.0, ...",
            "unresolvable",
        ),
        (
            1,
            "error: No solution found when resolving dependencies\n  cause: Because flash-attn==2.8.3 has "
            "no usable wheels and you require flash-attn==2.8.3 ...",
            "unresolvable",
        ),
        (
            2,
            "error: Failed to fetch: `http://127.0.0.1:9/simple/torch/`\n  Caused by: Request failed after 3 "
            "retries\n  Caused by: error sending request for url (http://127.0.0.1:9/simple/torch/)\n  Caused "
            "by: client error (Connect)\n  Caused by: tcp connect error: Connection refused (os error 111)",
            "unreachable",
        ),
        (
            2,
            "error: Failed to fetch: `https://no-such-host.invalid/simple/trl/`\n  Caused by: dns error: "
            "failed to lookup address information: Name or service not known",
            "unreachable",
        ),
        (None, "", "unreachable"),  # our own time limit
        (2, "error: unexpected argument '--bogus' found", "error"),
    ],
    ids=["ok", "unsatisfiable", "sdist-only", "refused", "dns", "timeout", "usage"],
)
def test_classify(returncode, output, status):
    outcome = pins.classify(returncode, output)
    assert outcome.status == status
    assert outcome.fails_ci == (status in ("unresolvable", "error"))


def test_read_versions_of_a_lock():
    lock = "torch==2.13.0\nsix==1.17.0 ; python_version > '3.11'\n# comment\nhuggingface-hub==1.33.0\n"
    assert pins.read_versions(lock) == {"torch": "2.13.0", "six": "1.17.0", "huggingface-hub": "1.33.0"}


# -- end to end: a loopback index, a stand-in uv -------------------------------------------------------

FAKE_UV = """#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_UV_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
mode = json.loads(Path(os.environ["FAKE_UV_MODES"]).read_text())[Path(args[args.index("--constraint") + 1]).name]
if mode == "ok":
    Path(args[args.index("--output-file") + 1]).write_text("torch==2.13.0\\ntransformers==5.17.0\\n")
    sys.exit(0)
if mode == "unsatisfiable":
    print("error: No solution found when resolving dependencies", file=sys.stderr)
    sys.exit(1)
print("error: Failed to fetch: `x`\\n  Caused by: error sending request for url (x)", file=sys.stderr)
sys.exit(2)
"""


@pytest.fixture(scope="module")
def index_url():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html><body>uv-0.13.9-py3-none-any.whl</body></html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"


def run_check(tmp_path, monkeypatch, capsys, index, modes):
    fake = tmp_path / "uv"
    fake.write_text(FAKE_UV.format(python=sys.executable))
    fake.chmod(0o755)
    (tmp_path / "modes.json").write_text(
        json.dumps({Path(s.constraints).name: m for s, m in zip(pins.PIN_SETS, modes, strict=True)})
    )
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_UV_MODES", str(tmp_path / "modes.json"))
    monkeypatch.setenv("FAKE_UV_LOG", str(log))
    code = pins.main(["--uv", str(fake), "--index-url", index, "--timeout", "60"])
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return code, capsys.readouterr().out, calls


def test_both_sets_resolve(tmp_path, monkeypatch, capsys, index_url):
    code, out, calls = run_check(tmp_path, monkeypatch, capsys, index_url, ["ok", "ok"])
    assert code == 0 and out.count("OK ") == 2 and "torch 2.13.0, transformers 5.17.0" in out
    first = calls[0]
    assert first[:2] == ["pip", "compile"] and first[first.index("--python-platform") + 1] == pins.PLATFORM
    assert first[first.index("--python-version") + 1] == "3.12" and ":all:" in first  # wheels only
    assert first[first.index("--index-url") + 1] == index_url
    assert [c[c.index("--extra") + 1] for c in calls] == ["trl", "verl"]


def test_a_set_that_cannot_resolve_fails(tmp_path, monkeypatch, capsys, index_url):
    code, out, _ = run_check(tmp_path, monkeypatch, capsys, index_url, ["unsatisfiable", "ok"])
    assert code == 1
    assert "FAIL" in out and "gpu-one-node.txt" in out.split("FAIL", 1)[1].splitlines()[0]


def test_a_registry_that_stops_answering_is_not_a_failure(tmp_path, monkeypatch, capsys, index_url):
    code, out, _ = run_check(tmp_path, monkeypatch, capsys, index_url, ["network", "ok"])
    assert code == 0 and "registry unreachable, not checked" in out and "FAIL" not in out


def test_an_unreachable_registry_is_said_and_nothing_is_resolved(tmp_path, monkeypatch, capsys):
    code, out, calls = run_check(tmp_path, monkeypatch, capsys, closed_port_url(), ["ok", "ok"])
    assert code == 0 and out.startswith("NOT CHECKED: registry unreachable") and calls == []
