"""A folder shipped as one setting (components/host/phase_settings.py shipped_tree) and installed
by lib.sh's install_tree under bash: every file back as it was sent, the same tree the same bytes
and no change on the host, a comment no change at all, a file gone from the tree gone from the
host, and another folder's module carried at its sub-path."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from components.host import phase_settings, script_text
from components.host.phase_settings import PHASES_DIR

LIB = PHASES_DIR / "lib.sh"


def package(root: Path) -> Path:
    """A small package under `root`/pkg, as a daemon's would be."""
    pkg = root / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The package."""\n')
    (pkg / "main.py").write_text('"""Main."""\n\n# why\nVALUE = "$HOME # not a comment"\n')
    (pkg / "sub" / "part.py").write_text("def f() -> int:\n    '''Doc.'''\n    return 1  # one\n")
    (pkg / "notes.txt").write_text("kept as written # yes\nno newline at the end")
    return pkg


def install(tree: str, folder: Path) -> str:
    """install_tree under bash, as a phase runs it: 'changed' or 'same'."""
    program = (
        f'source {LIB}\nif printf "%s\\n" "$TREE" | install_tree {folder}; then echo changed;'
        " else echo same; fi"
    )
    proc = subprocess.run(
        ["bash", "-c", program],
        env={"PATH": os.environ["PATH"], "PHASE": "test", "TREE": tree},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def files(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def phases_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "phases"
    folder.mkdir()
    package(folder)
    monkeypatch.setattr(phase_settings, "PHASES_DIR", folder)
    return folder


def test_a_shipped_tree_installs_every_file_as_sent_and_again_changes_nothing(
    phases_dir: Path, tmp_path: Path
) -> None:
    tree = phase_settings.shipped_tree("pkg")
    assert tree == phase_settings.shipped_tree("pkg"), "the same tree is the same bytes"
    host = tmp_path / "host" / "lib" / "pkg"
    assert install(tree, host) == "changed"
    source = phases_dir / "pkg"
    want = {
        "__init__.py": script_text.python((source / "__init__.py").read_text()),
        "main.py": script_text.python((source / "main.py").read_text()),
        "sub/part.py": script_text.python((source / "sub" / "part.py").read_text()),
        "notes.txt": "kept as written # yes\nno newline at the end\n",
    }
    assert files(host) == want
    assert "# why" not in want["main.py"] and "Doc." not in want["sub/part.py"]
    assert {oct(p.stat().st_mode & 0o777) for p in host.rglob("*") if p.is_file()} == {"0o644"}
    assert {oct(p.stat().st_mode & 0o777) for p in [host, host / "sub"]} == {"0o755"}
    # Python's byte code from a run of the package is not a difference.
    (host / "__pycache__").mkdir()
    (host / "__pycache__" / "main.cpython-312.pyc").write_bytes(b"\0")
    assert install(tree, host) == "same"
    assert sorted(p.name for p in host.parent.iterdir()) == ["pkg"], "no temp folder left"


def test_a_comment_is_the_same_tree_and_a_change_or_a_removal_is_installed(
    phases_dir: Path, tmp_path: Path
) -> None:
    host = tmp_path / "host" / "pkg"
    first = phase_settings.shipped_tree("pkg")
    assert install(first, host) == "changed"
    main = phases_dir / "pkg" / "main.py"
    main.write_text(main.read_text().replace("# why", "# why (reworded)"))
    assert phase_settings.shipped_tree("pkg") == first
    main.write_text(main.read_text().replace('"$HOME', '"$USER'))
    changed = phase_settings.shipped_tree("pkg")
    assert changed != first
    assert install(changed, host) == "changed"
    assert "$USER" in (host / "main.py").read_text()
    (phases_dir / "pkg" / "sub" / "part.py").unlink()
    assert install(phase_settings.shipped_tree("pkg"), host) == "changed"
    assert not (host / "sub" / "part.py").exists(), "a file no longer in the tree is gone"
    (host / "main.py").chmod(0o600)
    assert install(phase_settings.shipped_tree("pkg"), host) == "changed", "a mode is mended"
    assert oct((host / "main.py").stat().st_mode & 0o777) == "0o644"


def test_a_run_cut_midway_leaves_a_whole_tree_or_none_and_the_next_run_mends_it(
    phases_dir: Path, tmp_path: Path
) -> None:
    host = tmp_path / "host" / "pkg"
    tree = phase_settings.shipped_tree("pkg")
    # Cut between its renames: the old tree aside, no folder, a half-built new one.
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "pkg.old").mkdir()
    (tmp_path / "host" / "pkg.new.abc123").mkdir()
    (tmp_path / "host" / "pkg.new.abc123" / "main.py").write_text("half")
    assert install(tree, host) == "changed"
    assert sorted(p.name for p in host.parent.iterdir()) == ["pkg"]
    assert install(tree, host) == "same"


def test_another_folders_module_rides_at_its_sub_path(phases_dir: Path, tmp_path: Path) -> None:
    client = tmp_path / "clients" / "github.py"
    client.parent.mkdir()
    client.write_text('"""A client."""\n\n\ndef get() -> str:  # why\n    return "x"\n')
    tree = phase_settings.shipped_tree("pkg", {"clients/github.py": client})
    host = tmp_path / "host" / "pkg"
    assert install(tree, host) == "changed"
    assert (host / "clients" / "github.py").read_text() == script_text.python(client.read_text())
    with pytest.raises(ValueError, match="in the folder already"):
        phase_settings.shipped_tree("pkg", {"main.py": client})
    with pytest.raises(ValueError, match="not a plain relative path"):
        phase_settings.shipped_tree("pkg", {"../up.py": client})


def test_a_package_rides_under_its_own_name_beside_another(
    phases_dir: Path, tmp_path: Path
) -> None:
    """`at`: the folder's files under a sub-path, so the installed folder holds two packages
    side by side (autodown's: its own and the clients it imports)."""
    client = tmp_path / "clients" / "github.py"
    client.parent.mkdir()
    client.write_text("VALUE = 1\n")
    tree = phase_settings.shipped_tree("pkg", {"clients/github.py": client}, at="pkg")
    host = tmp_path / "host" / "app"
    assert install(tree, host) == "changed"
    assert set(files(host)) == {"pkg/__init__.py", "pkg/main.py", "pkg/sub/part.py",
                                "pkg/notes.txt", "clients/github.py"}  # fmt: skip
    with pytest.raises(ValueError, match="in the folder already"):
        phase_settings.shipped_tree("pkg", {"pkg/main.py": client}, at="pkg")


def test_a_tree_that_is_not_one_fails_the_phase_naming_it(tmp_path: Path) -> None:
    program = f'source {LIB}\nprintf "file a.py 5\\nonly one line\\n" | install_tree {tmp_path}/x'
    proc = subprocess.run(["bash", "-c", program], env={"PATH": os.environ["PATH"], "PHASE": "t"},
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 1
    assert "install_tree" in proc.stderr and "not a file's header" in proc.stderr
    assert not (tmp_path / "x").exists()
