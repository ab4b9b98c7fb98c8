"""flopwatch/yamlfile.py: the one reader of users' YAML files, one line per problem."""

from __future__ import annotations

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
