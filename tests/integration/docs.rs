//! The documentation holds together: README stays short and opens with the
//! two commands, every chapter of `docs/` is in `docs/SUMMARY.md`, and every
//! relative link (and its `#anchor`) in README and the book leads somewhere.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The Markdown files of the book and README.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files
}

#[test]
fn readme_is_short_and_opens_with_the_two_commands() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(lines < 300, "README.md has {lines} lines");
    let first_screen: String = readme.lines().take(25).collect::<Vec<_>>().join("\n");
    for command in ["cargo run --release -- demo", "script/test"] {
        assert!(
            first_screen.contains(command),
            "README's first screen lacks `{command}`"
        );
    }
}

#[test]
fn every_chapter_is_in_the_summary() {
    let summary = read(&root().join("docs/SUMMARY.md"));
    let linked: BTreeSet<String> = links(&summary)
        .into_iter()
        .map(|l| l.split('#').next().unwrap_or("").to_string())
        .collect();
    for file in documents()
        .iter()
        .filter(|f| f.starts_with(root().join("docs")))
    {
        let name = file
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .to_string();
        if name != "SUMMARY.md" {
            assert!(
                linked.contains(&name),
                "docs/SUMMARY.md does not link {name}"
            );
        }
    }
}

#[test]
fn every_relative_link_leads_somewhere() {
    let mut checked = 0;
    for file in documents() {
        let text = read(&file);
        let dir = file.parent().expect("a directory");
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (target, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target_path = if target.is_empty() {
                file.clone()
            } else {
                dir.join(target)
            };
            assert!(
                target_path.exists(),
                "{}: the link {link} leads nowhere",
                file.display()
            );
            if !anchor.is_empty() && target_path.extension().is_some_and(|e| e == "md") {
                let anchors = anchors(&read(&target_path));
                assert!(
                    anchors.contains(anchor),
                    "{}: the link {link} names no heading of {}",
                    file.display(),
                    target_path.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "{checked} links checked");
}

/// The targets of `[text](target)` links, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

/// The anchors a Markdown file offers: its headings, as a forge names them,
/// and `<a id>`s.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced && let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#').trim();
            let slug: String = heading
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            out.insert(slug);
        }
        let mut rest = line;
        while let Some(at) = rest.find("<a id=\"") {
            let after = &rest[at + 7..];
            let Some(end) = after.find('"') else { break };
            out.insert(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}
