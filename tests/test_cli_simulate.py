"""`tenantry simulate` from the command line: the default run, configuration
files, and bad input reported as one clear line (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tenantry.cli import main
from tenantry.model.command import load_config_toml

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "replica.toml"


def run_cli(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_example_toml_loads_every_section():
    cfg = load_config_toml(EXAMPLE)
    assert [t.name for t in cfg.tenants] == ["bulk", "app", "chat"]
    assert cfg.order.policy == "vtc" and cfg.eviction.max_evictions == 3 and cfg.prefix_cache == "salted"
    assert cfg.tenants[1].weight == 2.0 and cfg.tenants[0].kv_block_cap == 40000


def test_simulate_on_a_workload_file_prints_one_block_per_policy(tmp_path, capsys):
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(
        f'{{"request_id":{i},"tenant":"{"ab"[i % 2]}","arrival_s":{i * 0.01},"prompt_tokens":100,"output_tokens":10}}\n'
        for i in range(40)))
    code, out, err = run_cli(["simulate", "--workload", str(wl), "--policy", "fcfs", "vtc", "--history", str(tmp_path / "h.jsonl")], capsys)
    assert code == 0
    rows = [l.split() for l in out.splitlines() if l.startswith(("fcfs ", "vtc "))]
    assert [(r[0], r[1], r[2]) for r in rows if r[1] in "ab"] == [("fcfs", "a", "20"), ("fcfs", "b", "20"), ("vtc", "a", "20"), ("vtc", "b", "20")]
    assert (tmp_path / "h.fcfs.jsonl").exists() and (tmp_path / "h.vtc.jsonl").exists()


@pytest.mark.parametrize(
    "content,needle",
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,4808\n", "GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,-5,10\n", "ContextTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,12,ten\n", "GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04.0000000,12,10\n2023-11-16 18:17:03.0000000,12,10\n", "TIMESTAMP"),
    ],
)
def test_bad_trace_is_one_line_naming_file_line_and_field(tmp_path, capsys, content, needle):
    bad = tmp_path / "bad.csv"
    bad.write_text(content)
    code, out, err = run_cli(["simulate", "--azure", f"{bad}:t"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "bad.csv" in err and needle in err and "Traceback" not in err


def test_unknown_policy_is_one_line(capsys, tmp_path):
    wl = tmp_path / "w.jsonl"
    wl.write_text('{"request_id":0,"tenant":"a","arrival_s":0,"prompt_tokens":10,"output_tokens":1}\n')
    code, out, err = run_cli(["simulate", "--workload", str(wl), "--policy", "lifo"], capsys)
    assert code == 2 and "--policy='lifo'" in err and "vtc" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("weight", ["0", "-1.5"])
def test_tenant_with_bad_weight_in_toml_names_file_tenant_and_field(tmp_path, capsys, weight):
    cfg = tmp_path / "r.toml"
    cfg.write_text(f'[replica]\nnum_blocks = 100\n\n[[tenants]]\nname = "a"\n\n[[tenants]]\nname = "b"\nweight = {weight}\n')
    code, out, err = run_cli(["simulate", "--config", str(cfg)], capsys)
    assert code == 2 and "r.toml" in err and "[[tenants]] #2" in err and f"weight={weight}:" in err


def test_unknown_toml_key_is_named(tmp_path, capsys):
    cfg = tmp_path / "r.toml"
    cfg.write_text('[order]\npolicy = "vtc"\nlyft = true\n\n[[tenants]]\nname = "a"\n')
    code, out, err = run_cli(["simulate", "--config", str(cfg)], capsys)
    assert code == 2 and "[order]" in err and "lyft" in err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "tenantry.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "simulate" in out.stdout
