"""Does every public flowgp estimator pass scikit-learn's conformance suite (`check_estimator`) at a budget where
it can learn the checks' toy problems?

Answer (2026-11-25, after the fixes it found): yes. All eight estimators 0 failed (the five regressors 50 passed
each, the three classifiers 53; 2 skipped each: array-API checks without `SCIPY_ARRAY_API`). The first run found
label-contract, unfitted-predict and row-invariance defects, each fixed with a test in
tests/estimators/test_sklearn_contract.py.

Run from the repository root:

    OMP_NUM_THREADS=1 python -m benchmarks.studies.sklearn_conformance --out runs/sklearn-conformance

Each estimator is checked with a small budget (few inducing points, a short fit) that still learns the checks'
toy problems. One JSON line per (estimator, check) goes to OUT/checks.jsonl as it finishes, so an interrupted run
resumes where it stopped; OUT/summary.md counts passes and lists every failure with its message.
"""
import argparse
import json
import os
import time
import warnings

from sklearn.base import clone
from sklearn.utils.estimator_checks import check_dataframe_column_names_consistency, check_estimator

import flowgp

SETTINGS = {
    "SVGPRegressor": dict(num_inducing=8, epochs=150),
    # the flow models learn check_regressors_train's toy problem (R^2 > 0.5) more slowly than the SVGP: at 150
    # epochs R^2 is 0.45 (TGP, robust or plain fit) against the SVGP's 0.63; at 400, 0.76 (a budget matter)
    "TGPRegressor": dict(num_inducing=8, epochs=400),
    "WarpedGPRegressor": dict(num_inducing=8, epochs=400),
    "SVGPClassifier": dict(num_inducing=8, epochs=150),
    "TGPClassifier": dict(num_inducing=8, epochs=150),
    "DeepGPRegressor": dict(layers=2, num_inducing=8, epochs=150, num_samples_predict=20),
    "DeepGPClassifier": dict(layers=2, num_inducing=8, epochs=150, num_samples_predict=20),
    # 150 epochs leave R^2 < 0.5 on check_regressors_train (a budget matter: 400 pass, 20 s)
    "LatentDeepGPRegressor": dict(num_inducing=8, epochs=400, num_samples_predict=200),
}


#: checks of scikit-learn's suite that `check_estimator` does not yield by itself (it needs pandas): the
#: feature-name contract on DataFrames with reordered, renamed or missing columns
EXTRA_CHECKS = (check_dataframe_column_names_consistency,)


def run_extra_check(check, name, estimator, record):
    """Run one check by hand and record it as check_estimator's callback would (a SkipTest is a skip)."""
    from unittest import SkipTest

    try:
        check(name, estimator)
    except SkipTest as err:
        record(estimator, check.__name__, err, "skipped", False, None)
    except Exception as err:  # noqa: BLE001 - a failed check, recorded with its message
        record(estimator, check.__name__, err, "failed", False, None)
    else:
        record(estimator, check.__name__, None, "passed", False, None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/sklearn-conformance")
    parser.add_argument("--estimators", default=",".join(SETTINGS))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "checks.jsonl")
    done = set()
    if os.path.exists(path):
        with open(path) as fh:
            done = {(r["estimator"], r["check"]) for r in map(json.loads, fh)}
    for name in args.estimators.split(","):
        cls = getattr(flowgp, name)
        estimator = cls(verbose=False, kmeans_restarts=1, **SETTINGS[name])
        pending = []

        def record(estimator, check_name, exception, status, expected_to_fail, expected_to_fail_reason):
            pending.append(dict(estimator=name, check=check_name, status=status,
                                message=None if exception is None else f"{type(exception).__name__}: {exception}"[:500]))

        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_estimator(estimator, on_fail=None, on_skip=None, callback=record)
            for check in EXTRA_CHECKS:  # the checks check_estimator leaves out, run by hand
                run_extra_check(check, name, clone(estimator), record)
        with open(path, "a") as fh:
            for row in pending:
                if (row["estimator"], row["check"]) not in done:
                    fh.write(json.dumps(row) + "\n")
        print(f"{name}: {sum(r['status'] == 'passed' for r in pending)} passed, "
              f"{sum(r['status'] == 'failed' for r in pending)} failed, "
              f"{sum(r['status'] == 'skipped' for r in pending)} skipped, {time.perf_counter() - start:.0f} s", flush=True)
    write_summary(path, os.path.join(args.out, "summary.md"))


def write_summary(path, out):
    with open(path) as fh:
        rows = [json.loads(line) for line in fh]
    lines = ["| estimator | passed | failed | skipped |", "|---|---|---|---|"]
    for name in dict.fromkeys(r["estimator"] for r in rows):
        mine = [r for r in rows if r["estimator"] == name]
        lines.append(f"| {name} | " + " | ".join(str(sum(r['status'] == s for r in mine))
                                                for s in ("passed", "failed", "skipped")) + " |")
    failures = [r for r in rows if r["status"] == "failed"]
    if failures:
        lines += ["", "Failures:", ""] + [f"- {r['estimator']} `{r['check']}`: {r['message']}" for r in failures]
    with open(out, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
