"""`whatif suggest` on the shared traces the issue names (Qwen H100 inference, ResNet50 V100
training, AlexNet A100) and the bundled sample: the ranked suggestions, the time taken, and the
top entry checked by predicting its setting alone as a scenario (the two speedups must be equal).
Then the one real before/after pair for a suggested setting: ResNet50 with DataLoader
num_workers=0, the suggestion dataloader(workers=4) against the num_workers=4 captures.

Run: .venv/bin/python bench/suggest.py   (the shared traces are read from ../shared/traces)
"""
from __future__ import annotations

import time
from pathlib import Path

from whatif.api import analyze, predict
from whatif.suggest import suggest
from whatif.summary import analysis_document, scenario_headline
from whatif.transforms.scenario import scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
TRACES = [ROOT / "sample_traces" / "llm_serve",
          SHARED / "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
          SHARED / "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
          SHARED / "hta/critical_path_alexnet_a100.json.gz"]


def main() -> None:
    for path in TRACES:
        if not path.exists():
            print(f"{path.name}: absent, skipped")
            continue
        t0 = time.perf_counter()
        base = analyze(path)
        t1 = time.perf_counter()
        doc = suggest(base)
        t2 = time.perf_counter()
        print(f"{path.name} ({doc.device or 'no GPU'}): mean step {doc.baseline_mean_step_ns / 1e6:.3f} ms; "
              f"analyze {t1 - t0:.2f} s, suggest {t2 - t1:.2f} s")
        for s in doc.suggestions:
            also = ", ".join(f"{k} {v:.3f}x" for k, v in s.others.items())
            print(f"  {s.rank}. {s.setting:<30} {s.headline.speedup:.3f}x  saved {s.saved_ns_per_step / 1e6:.3f} "
                  f"ms/step" + (f"  (also tried: {also})" if also else ""))
        if doc.suggestions:
            top = doc.suggestions[0]
            table = {"name": top.transform, **top.params}
            alone = scenario_from_dict({"name": "alone", "transform": [table]}, source="<bench>")
            again = scenario_headline(base, predict(base, [alone]).scenarios[0]).speedup
            print(f"  top entry alone: {again:.6f}x vs {top.headline.speedup:.6f}x "
                  f"({'equal' if again == top.headline.speedup else 'DIFFERENT'})")
        reasons = sorted({k.reason.split(":")[0][:40] for k in doc.skipped})
        print(f"  not tried: {len(doc.skipped)} ({', '.join(reasons)})")


KINETO = SHARED / "kineto"
BEFORE = ["resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",   # the capture suggest ran on
          "resnet50_num_workers_0__worker0.1623143566756.pt.trace.json.gz"]   # its twin: run-to-run noise
AFTER = ["resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz",
         "resnet50_num_workers_4__worker0.1623213129365.pt.trace.json.gz"]


def before_after() -> None:
    if not all((KINETO / n).exists() for n in BEFORE + AFTER):
        print("ResNet50 num_workers pair: absent, skipped")
        return
    base = analyze(KINETO / BEFORE[0])
    table = {"name": "dataloader", "workers": 4}
    predicted = scenario_headline(base, predict(base, [scenario_from_dict(
        {"name": "workers 4", "transform": [table]}, source="<bench>")]).scenarios[0])
    measured = [analysis_document(analyze(KINETO / n)).mean_measured_step_ns for n in BEFORE + AFTER]
    before_ns, twin_ns, after_ns = measured[0], measured[1], sum(measured[2:]) / 2
    print(f"ResNet50 V100, DataLoader num_workers 0 -> 4: before {before_ns / 1e6:.1f} ms (twin capture "
          f"{twin_ns / 1e6:.1f} ms, noise {abs(twin_ns / before_ns - 1):.0%}); after measured "
          f"{measured[2] / 1e6:.1f} / {measured[3] / 1e6:.1f} ms")
    print(f"  dataloader(workers=4) predicts {predicted.mean_step_ns / 1e6:.1f} ms "
          f"({predicted.speedup:.2f}x; measured {before_ns / after_ns:.2f}x): error "
          f"{predicted.mean_step_ns / after_ns - 1:+.0%}, 'no change' {before_ns / after_ns - 1:+.0%}")


if __name__ == "__main__":
    main()
    before_after()
