//! Every module map holds: a `| module | owns |` (or `| floor | owns |`)
//! table in a file's opening comment names exactly the modules that file
//! declares with `mod` lines (test modules aside), so the map a newcomer
//! reads is the house as built.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first column of the map in `text`'s opening comment, if it has one.
fn mapped(text: &str) -> Option<BTreeSet<String>> {
    let opening = text.lines().take_while(|l| l.starts_with("//!"));
    let mut rows = opening
        .map(|l| l.trim_start_matches("//!").trim())
        .skip_while(|l| *l != "| module | owns |" && *l != "| floor | owns |")
        .peekable();
    rows.next()?;
    let names = rows
        .skip(1) // the |---|---| line
        .take_while(|l| l.starts_with('|'))
        .filter_map(|row| {
            let cell = row.split('|').nth(1)?.trim();
            // A row for the file itself names no module.
            if cell == "this file" {
                return None;
            }
            let name = cell.trim_matches(|c| c == '[' || c == ']' || c == '`');
            // A module named like an item beside it is linked as `mod@name`.
            Some(name.trim_start_matches("mod@").to_string())
        })
        .collect();
    Some(names)
}

/// The modules `text` declares (`mod x;` or `mod x {`, any visibility), less
/// those under `#[cfg(test)]`.
fn declared(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut test_only = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with("#[cfg(test)]") {
            test_only = true;
            continue;
        }
        let rest = line
            .strip_prefix("pub(crate) ")
            .or_else(|| line.strip_prefix("pub "))
            .unwrap_or(line);
        let name = rest
            .strip_prefix("mod ")
            .and_then(|r| r.strip_suffix(';').or_else(|| r.strip_suffix(" {")));
        if let Some(name) = name
            && !test_only
        {
            names.insert(name.trim().to_string());
        }
        if !line.starts_with("#[") {
            test_only = false;
        }
    }
    names
}

#[test]
fn every_module_map_names_the_modules_declared() {
    let mut files = Vec::new();
    sources(&root().join("crates"), &mut files);
    sources(&root().join("src"), &mut files);
    let mut maps = 0;
    let mut wrong = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let Some(mapped) = mapped(&text) else {
            continue;
        };
        maps += 1;
        let declared = declared(&text);
        if mapped != declared {
            let only_map: Vec<_> = mapped.difference(&declared).collect();
            let only_mod: Vec<_> = declared.difference(&mapped).collect();
            wrong.push(format!(
                "{}: in the map only {only_map:?}, declared only {only_mod:?}",
                file.strip_prefix(root()).unwrap_or(&file).display()
            ));
        }
    }
    assert!(maps >= 10, "only {maps} module maps found");
    assert!(
        wrong.is_empty(),
        "module maps that disagree:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_map_is_read_from_its_table_and_mod_lines() {
    let text = "//! A room.\n//!\n//! | module | owns |\n//! |---|---|\n//! | [`a`] | one |\n//! | [`b2`] | two |\n//! | [`c`] | three |\n//! | this file | the rest |\n\npub mod a;\nmod b2;\npub mod c {\n}\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod more_tests {\n}\n";
    let want: BTreeSet<String> = ["a", "b2", "c"].map(String::from).into();
    assert_eq!(mapped(text), Some(want.clone()));
    assert_eq!(declared(text), want);
    assert_eq!(mapped("//! No map.\nmod a;\n"), None);
}
