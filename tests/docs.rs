//! The documentation against the code: the README's policy example is the source of a
//! policy this build compiles, and the documents speak of this repository only.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The first fenced block of `lang` in `text`.
fn first_block<'a>(text: &'a str, lang: &str) -> Option<&'a str> {
    let open = format!("```{lang}\n");
    let start = text.find(&open)? + open.len();
    let end = text[start..].find("```")? + start;
    Some(&text[start..end])
}

#[test]
fn the_policy_example_in_the_docs_is_the_compiled_fixture() {
    let readme = std::fs::read_to_string(repo().join("docs/writing-policies.md")).unwrap();
    let example = first_block(&readme, "rust").expect("a rust example");
    let source =
        std::fs::read_to_string(repo().join("policies/fixtures/quiet-hours/src/lib.rs")).unwrap();
    // The file starts with one line of its own saying what it is.
    let (_, code) = source.split_once('\n').unwrap();
    assert_eq!(
        example, code,
        "docs/writing-policies.md and quiet-hours differ"
    );
}

#[test]
fn the_quiet_hours_example_builds_and_decides() {
    let bytes = std::fs::read(tollgate::scenario::default_fixtures().join("quiet-hours.wasm"))
        .expect("the build made the example policy");
    let runtime = tollgate::runtime::Runtime::new().unwrap();
    let policy = runtime
        .load(&bytes, tollgate::runtime::PolicyLimits::DEFAULT.any_size())
        .unwrap();
    assert_eq!(policy.info.name, "quiet-hours");
}

#[test]
fn documents_name_no_file_outside_the_repository() {
    let mut checked = 0;
    let mut stack = vec![
        repo().join("docs"),
        repo().join("host"),
        repo().join("guest"),
    ];
    stack.push(repo().join("README.md"));
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
            continue;
        }
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !["md", "rs", "toml"].contains(&ext) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let outside = ["SPEC", ".md"].concat();
        assert!(
            !text.contains(&outside),
            "{} names {outside}",
            path.display()
        );
        checked += 1;
    }
    assert!(checked > 20, "only {checked} files checked");
}

#[test]
fn the_docs_the_readme_links_exist() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut links = 0;
    for part in readme.split("](").skip(1) {
        let target = part.split(')').next().unwrap();
        if target.starts_with("http") || target.starts_with('#') {
            continue;
        }
        let file = target.split('#').next().unwrap();
        assert!(repo().join(file).exists(), "README links to missing {file}");
        links += 1;
    }
    assert!(links >= 6, "README links to only {links} documents");
}
