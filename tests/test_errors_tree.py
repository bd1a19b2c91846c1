"""The error tree (DESIGN.md §9, STYLE.md #5): every exception class millstream defines lives in
``millstream.errors`` or ``millstream.model.errors``; faults are split by whose they are; the
protocol errors come as a pair, local and remote (as h11's)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import millstream
import millstream.model
from millstream import errors
from millstream.model import errors as model_errors

#: Packages left out: the benchmarks leave the shipped package (issue 22 item 7).
_SKIPPED_PACKAGES = ("millstream.bench",)

def _modules() -> list[str]:
    names = []
    for package in (millstream, millstream.model):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.startswith(_SKIPPED_PACKAGES) or info.name.startswith("millstream.spark"):
                continue
            names.append(info.name)
    return names


def test_every_exception_class_lives_in_the_errors_tree() -> None:
    outside = set()
    for name in _modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name \
                    and name not in ("millstream.errors", "millstream.model.errors"):
                outside.add(f"{name}.{value.__qualname__}")
    assert not outside, f"exception classes outside the errors tree: {sorted(outside)}"


def test_every_error_of_the_tree_has_a_root_and_a_docstring() -> None:
    for name in errors.__all__:
        value = getattr(errors, name)
        assert issubclass(value, errors.MillstreamError), name
        documented = bool(value.__doc__) and value.__doc__ != errors.MillstreamError.__doc__
        assert documented or value is errors.MillstreamError, f"{name} needs a docstring that says when it is raised"


def test_the_protocol_errors_are_a_pair_split_by_whose_fault() -> None:
    assert issubclass(errors.RemoteProtocolError, errors.PeerError)
    assert not issubclass(errors.RemoteProtocolError, errors.CallerError)
    assert issubclass(errors.LocalProtocolError, errors.CallerError)
    assert not issubclass(errors.LocalProtocolError, errors.PeerError)
    assert errors.ProtocolError is errors.RemoteProtocolError  # (the name most code raises it by)
    assert model_errors.LocalProtocolError is errors.LocalProtocolError


def test_the_signals_that_stay_inside_are_in_the_tree_by_whose_fault() -> None:
    """The four classes that lived outside the tree (issue 22 item 4), each where its fault puts it."""
    from millstream.model import durable_log, stable_writer
    assert durable_log.NotEnabled is stable_writer.NotEnabled is model_errors.NotEnabled
    assert issubclass(model_errors.NotEnabled, errors.CallerError)
    assert not issubclass(model_errors.NotEnabled, errors.InternalError)  # (the explorers catch it)
    assert issubclass(errors.DamagedRecordError, errors.DataCorruptionError)
    assert issubclass(errors.MergeOutcomeUnknownError, errors.ConnectionLostError)
    assert errors.DamagedRecordError(7, "checksum mismatch").offset == 7


@pytest.mark.parametrize("name", ["WireProtocolError", "MalformedFrameError", "FrameTooLargeError",
                                  "UnknownCommandError", "MalformedEventError", "IncompatibleVersionError"])
def test_bytes_received_are_the_peers_fault(name: str) -> None:
    from millstream import wire
    cls = getattr(errors, name)
    assert getattr(wire, name) is cls
    assert issubclass(cls, errors.RemoteProtocolError) and not issubclass(cls, errors.CallerError)


@pytest.mark.parametrize("name", ["InvalidCommandError", "CommandTooLargeError"])
def test_what_the_caller_asks_to_send_is_the_callers_fault(name: str) -> None:
    from millstream import wire
    cls = getattr(errors, name)
    assert getattr(wire, name) is cls
    assert issubclass(cls, errors.LocalProtocolError) and issubclass(cls, errors.InvalidArgumentError)
    assert not issubclass(cls, errors.PeerError)


def _internal_error_names() -> set[str]:
    """The names of ``InternalError`` and every subclass of it defined in millstream."""
    for name in _modules():
        importlib.import_module(name)
    found, todo = set(), [errors.InternalError]
    while todo:
        cls = todo.pop()
        found.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return found


def test_no_internal_error_is_raised_to_steer() -> None:
    """``InternalError`` means "cannot happen": no handler catches one (or a subclass) to decide what
    to do next, and no private exception steers the controller's workflows."""
    import ast
    import pathlib
    names = _internal_error_names() | {"_LiveTransactions"}
    root = pathlib.Path(millstream.__file__).parent
    caught = set()
    for path in sorted(root.rglob("*.py")):
        if "bench" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                for name in ast.walk(node.type):
                    if isinstance(name, ast.Name) and name.id in names:
                        caught.add(f"{path.relative_to(root)}: {name.id}")
    assert not caught, sorted(caught)
