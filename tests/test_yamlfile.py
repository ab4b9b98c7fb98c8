"""flopwatch/yamlfile.py: the one reader of users' YAML files, one line per problem."""

from __future__ import annotations

import re

import pytest

from flopwatch import yamlfile
from flopwatch.yamlfile import YamlFileError


def test_a_syntax_error_names_the_file_and_line_but_not_the_line_text(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  alice: $2y$10$secret\n  bob: [unclosed\n")
    with pytest.raises(YamlFileError) as caught:
        yamlfile.load(path, "web config")
    message = str(caught.value)
    assert message.startswith(f"web config {path}: not valid YAML at line ")
    assert "$2y$" not in message and "\n" not in message


@pytest.mark.parametrize(("content", "expected"), [
    (b"", "None"), (b"a: 1\nb: [x, y]\n", "{'a': 1, 'b': ['x', 'y']}"),
])
def test_documents_and_empty_files(tmp_path, content, expected):
    path = tmp_path / "f.yml"
    path.write_bytes(content)
    assert repr(yamlfile.load(path)) == expected


@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe", "not a UTF-8 text file"), (b"#" * (yamlfile.MAX_FILE_BYTES + 1), "larger than 1 MiB"),
])
def test_files_that_cannot_be_configs(tmp_path, content, message):
    path = tmp_path / "f.yml"
    path.write_bytes(content)
    with pytest.raises(YamlFileError, match=message):
        yamlfile.load(path, "scenario file")


def test_a_missing_file(tmp_path):
    with pytest.raises(YamlFileError, match=r"rule file .*nope.yml: cannot read it \(No such file"):
        yamlfile.load(tmp_path / "nope.yml", "rule file")


def test_python_tags_are_not_constructed(tmp_path):
    path = tmp_path / "f.yml"
    path.write_text("x: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(YamlFileError, match="not valid YAML at line 1"):
        yamlfile.load(path)


def test_compose_gives_nodes_with_lines_and_errors_as_file_colon_line(tmp_path):
    path = tmp_path / "rails.yml"
    path.write_text("rails:\n  - nodes: n1\n")
    root = yamlfile.compose(path, "rails file")
    assert root.value[0][1].value[0].start_mark.line + 1 == 2      # the readers' line numbers
    path.write_text("")
    assert yamlfile.compose(path) is None
    path.write_text("a: 1\nb: [\n")
    with pytest.raises(YamlFileError, match=rf"^{re.escape(str(path))}:3: not valid YAML \(expected"):
        yamlfile.compose(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(YamlFileError, match=r"rails file .*: not a UTF-8 text file"):
        yamlfile.compose(path, "rails file")


def test_files_of_a_folder_or_one_file(tmp_path):
    for name in ("b.yaml", "a.yml", "alertmanager.yml", "notes.txt"):
        (tmp_path / name).write_text("")
    assert [p.name for p in yamlfile.files(tmp_path, "rule files", skip=("alertmanager.yml",))] == ["a.yml", "b.yaml"]
    assert yamlfile.files(tmp_path / "a.yml", "rule files") == [tmp_path / "a.yml"]
    with pytest.raises(YamlFileError, match="no such scenario file or directory"):
        yamlfile.files(tmp_path / "nope", "scenario files")
    (tmp_path / "empty").mkdir()
    with pytest.raises(YamlFileError, match=r"empty: no scenario files \(\*\.yml\) in this directory"):
        yamlfile.files(tmp_path / "empty", "scenario files")
