"""Class labels that cannot be classes: mixed kinds and missing labels get errors naming y and the fix."""
import numpy as np
import pytest

from flowgp.estimators import DeepGPClassifier, SVGPClassifier, TGPClassifier

CLASSIFIERS = [lambda: SVGPClassifier(epochs=1, num_inducing=4, verbose=False),
               lambda: TGPClassifier(epochs=1, num_inducing=4, verbose=False),
               lambda: DeepGPClassifier(layers=2, epochs=1, num_inducing=4, verbose=False)]
IDS = ["svgp", "tgp", "dgp"]
X = np.random.default_rng(0).normal(size=(12, 2))


@pytest.mark.parametrize("make", CLASSIFIERS, ids=IDS)
@pytest.mark.parametrize("labels", [np.array(["a", 1] * 6, dtype=object), ["a", 1] * 6, [2.5, "b"] * 6],
                         ids=["object-array", "list", "float-and-str"])
def test_mixed_string_and_number_labels_are_refused_naming_y_and_the_fix(make, labels):
    # before: numpy's "'<' not supported between instances of 'int' and 'str'" (object array), or a list
    # silently coerced to strings so that predict returned '1' for the label 1
    with pytest.raises(TypeError, match=r"y mixes labels of different kinds.*same type"):
        make().fit(X, labels)


@pytest.mark.parametrize("make", CLASSIFIERS, ids=IDS)
@pytest.mark.parametrize("missing", [np.nan, None], ids=["nan", "none"])
def test_a_missing_label_says_so(make, missing):
    # before: DeepGPClassifier took NaN as a class and then reported "labels not seen in fit"
    labels = np.array([0.0, 1.0] * 6, dtype=object if missing is None else float)
    labels[3] = missing
    with pytest.raises(ValueError, match=r"y contains (None or )?NaN") as err:
        make().fit(X, labels)
    assert "not seen in fit" not in str(err.value)


@pytest.mark.parametrize("make", CLASSIFIERS, ids=IDS)
def test_a_missing_label_at_scoring_time_says_so(make):
    est = make().fit(X, np.array(["a", "b"] * 6))
    with pytest.raises(ValueError, match=r"y contains None or NaN"):
        est.log_predictive_density(X, np.array(["a", np.nan] * 6, dtype=object))
    with pytest.raises(ValueError, match=r"labels not seen in fit: \['c'\]"):
        est.log_predictive_density(X, np.array(["a", "c"] * 6))
    assert set(est.predict(X)) <= {"a", "b"}
