"""Label and field selectors as the apiserver parses and matches them."""

from __future__ import annotations

import pytest

from istiod_local.controlplane.kubeapi.selectors import (
    NAMESPACE_FIELDS,
    POD_FIELDS,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)

LABELS = {"app": "echo", "version": "v1", "security.istio.io/tlsMode": "istio"}


@pytest.mark.parametrize(("selector", "expected"), [
    ("", True),
    ("app=echo", True),
    ("app==echo", True),
    ("app!=echo", False),
    ("app!=other", True),
    ("missing!=x", True),
    ("app in (echo, other)", True),
    ("app in (other)", False),
    ("app notin (other)", True),
    ("app notin (echo)", False),
    ("missing notin (x)", True),
    ("version", True),
    ("missing", False),
    ("!missing", True),
    ("!app", False),
    ("app=echo,version in (v1,v2),!canary", True),
    ("app=echo,version=v2", False),
    ("security.istio.io/tlsMode=istio", True),
])
def test_label_selector_grammar(selector: str, expected: bool) -> None:
    assert parse_label_selector(selector).matches(LABELS) is expected


@pytest.mark.parametrize("selector", ["=x", "a b=c", "app in (a b)", "app=echo,", "x=" + "a" * 64, "-a=b"])
def test_label_selector_refuses_what_does_not_parse(selector: str) -> None:
    with pytest.raises(SelectorError, match="unable to parse requirement"):
        parse_label_selector(selector)


def test_an_empty_label_value_is_a_value() -> None:
    assert parse_label_selector("app=").matches({"app": ""})
    assert not parse_label_selector("app=").matches(LABELS)


POD = {"metadata": {"name": "echo-1", "namespace": "default"}, "spec": {"nodeName": "node-a"},
       "status": {"phase": "Running", "podIP": "10.0.0.5"}}


@pytest.mark.parametrize(("selector", "expected"), [
    ("spec.nodeName=node-a", True),
    ("spec.nodeName==node-a", True),
    ("spec.nodeName!=node-a", False),
    ("spec.nodeName=node-b", False),
    ("metadata.name=echo-1,metadata.namespace=default", True),
    ("status.phase=Running,spec.nodeName=node-a", True),
    ("status.phase!=Running", False),
    ("status.podIP=10.0.0.5", True),
    ("spec.hostNetwork=false", True),
])
def test_pod_field_selectors(selector: str, expected: bool) -> None:
    assert parse_field_selector(selector, POD_FIELDS).matches(POD) is expected


def test_unsupported_field_is_refused_in_the_apiservers_words() -> None:
    with pytest.raises(SelectorError) as refused:
        parse_field_selector("spec.foo=bar", POD_FIELDS)
    assert str(refused.value) == "field label not supported: spec.foo"
    with pytest.raises(SelectorError, match=r"field label not supported: spec\.nodeName"):
        parse_field_selector("spec.nodeName=x", NAMESPACE_FIELDS)


def test_field_selector_value_of_pins_an_equality() -> None:
    selector = parse_field_selector("spec.nodeName=node-a,status.phase!=Failed", POD_FIELDS)
    assert selector.value_of("spec.nodeName") == "node-a"
    assert selector.value_of("status.phase") is None
