"""Benchmarks stay runnable: a tiny run of each, with no timing assertions."""

from conftest import load_script


def test_image_prep_benchmark_runs_and_prints_ratios(capsys):
    bench = load_script("bench_image_prep", folder="benchmarks")
    assert bench.main(["--images", "5", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "machine:" in out and "kit/seed" in out
    assert any(line.startswith("all ") and line.rstrip().endswith("x") for line in out.splitlines())


def test_benchmark_corpus_spans_sizes_and_formats():
    bench = load_script("bench_image_prep", folder="benchmarks")
    items = bench.corpus(25)
    megapixels = sorted(w * h / 1e6 for _, (w, h), _ in items)
    assert megapixels[0] < 0.5 and megapixels[-1] >= 12
    assert {f for f, _, _ in items} == {"JPEG", "PNG", "WEBP"}
    assert bench.seed_approach(items[0][2]).size == (225, 225)
