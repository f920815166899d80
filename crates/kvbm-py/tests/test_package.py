"""The installed package: its version, its type stubs, and that the stubs
name exactly what the extension has."""

import ast
import importlib.resources

import kvbm


def stub_tree():
    stub = importlib.resources.files("kvbm") / "__init__.pyi"
    return ast.parse(stub.read_text())


# The extension module and the vLLM adapter: submodules, not API names.
SUBMODULES = {"kvbm", "vllm"}


def public(names):
    return {name for name in names if not name.startswith("_")}


def test_the_wheel_ships_stubs_and_py_typed():
    files = importlib.resources.files("kvbm")
    assert (files / "py.typed").is_file()
    assert (files / "__init__.pyi").is_file()
    assert (files / "vllm.py").is_file()
    assert kvbm.__version__.count(".") == 2


def test_the_stubs_name_every_class_function_and_method():
    tree = stub_tree()
    stubbed = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stubbed[node.name] = public(
                item.name for item in node.body if isinstance(item, ast.FunctionDef)
            )
        elif isinstance(node, ast.FunctionDef):
            stubbed[node.name] = None
    exported = public(dir(kvbm)) - SUBMODULES
    assert set(stubbed) == exported
    assert set(kvbm.__all__) == exported | {"__version__"}
    for name, methods in stubbed.items():
        if methods is None or issubclass(getattr(kvbm, name), BaseException):
            continue
        assert methods == public(dir(getattr(kvbm, name))), name


def test_every_class_and_function_has_a_docstring():
    for name in public(dir(kvbm)) - SUBMODULES:
        item = getattr(kvbm, name)
        if callable(item):
            assert item.__doc__, name
