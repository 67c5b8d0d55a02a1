//! The house rule of docs/architecture.md: no file of a product crate, nor of the benchmarks'
//! crate, imports one that imports it back, directly or around a circle. Read from the sources: a file's imports are the
//! `crate::...` paths in its code (comments and its test module left out), each taken to the
//! longest module path that is a file of the crate. And every test file of a crate whose tests
//! build as one binary is declared in its `tests/main.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: [&str; 7] = [
    "core",
    "node",
    "runtime",
    "kubelet",
    "placement",
    "cli",
    "bench",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `a::b` for `src/a/b.rs` and `src/a/b/mod.rs`; empty for `lib.rs` and `main.rs`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without comments and without its test module.
fn code(text: &str) -> String {
    let end = [
        "#[cfg(test)]\nmod tests",
        "#[cfg(test)]\npub(crate) mod tests",
    ]
    .iter()
    .filter_map(|m| text.find(m))
    .min()
    .unwrap_or(text.len());
    text[..end]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path that follows `crate::` in `code`, with the names inside one level of braces
/// (`crate::{a, b::c}`) each a path of its own.
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or_default();
            out.extend(
                inner
                    .split(',')
                    .map(|p| p.trim().chars().take_while(|c| ident(*c)).collect()),
            );
        } else {
            out.push(rest.chars().take_while(|c| ident(*c)).collect());
        }
    }
    out
}

/// The files each file of the crate at `src` imports.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(src, f)).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let me = module_of(src, file);
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let mut to = BTreeSet::new();
        for path in crate_paths(&code(&text)) {
            let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
            let target = (1..=parts.len())
                .rev()
                .map(|n| parts[..n].join("::"))
                .find(|m| modules.contains(m));
            if let Some(target) = target
                && target != me
                // A file's own submodules are its rooms, not its neighbours.
                && !target.starts_with(&format!("{me}::"))
                && !me.is_empty()
            {
                to.insert(target);
            }
        }
        graph.insert(me, to);
    }
    graph
}

/// The circles of `graph`: its strongly connected components of more than one file.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (m, from_m) in &reaches {
        let circle: BTreeSet<String> = from_m
            .iter()
            .filter(|other| reaches.get(other).is_some_and(|r| r.contains(*m)))
            .cloned()
            .collect();
        if circle.len() > 1 && !out.contains(&circle) {
            out.push(circle);
        }
    }
    out
}

#[test]
fn no_file_of_a_product_crate_imports_one_that_imports_it_back() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for name in CRATES {
        let src = crates.join(name).join("src");
        let graph = imports(&src);
        assert!(graph.len() > 3, "{}: no sources read", src.display());
        for circle in circles(&graph) {
            found.push(format!("crates/{name}: {circle:?}"));
        }
    }
    assert!(found.is_empty(), "file circles:\n{}", found.join("\n"));
}

#[test]
fn every_test_file_of_a_one_binary_crate_is_a_module_of_its_main() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The crates whose `tests/` build as one binary say so in their manifest (docs/testing.md).
    let mut one_binary = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let dir = entry.unwrap().path();
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
        if manifest.lines().any(|l| l.trim() == "autotests = false") {
            one_binary.push(dir.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    assert!(
        one_binary.len() >= 2,
        "no crate with `autotests = false` found in {}",
        crates.display()
    );
    for name in &one_binary {
        let dir = crates.join(name).join("tests");
        let main = std::fs::read_to_string(dir.join("main.rs")).unwrap();
        let declared: BTreeSet<&str> = main
            .lines()
            .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        let mut files = BTreeSet::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs")
                && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
                && stem != "main"
            {
                files.insert(stem.to_owned());
            }
        }
        assert!(files.len() > 3, "{}: no test files read", dir.display());
        let missing: Vec<&String> = files
            .iter()
            .filter(|f| !declared.contains(f.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "crates/{name}/tests: {missing:?} not declared in tests/main.rs, so never built"
        );
    }
}

#[test]
fn the_reader_finds_a_circle_and_the_imports_it_is_made_of() {
    let code = code(
        "use crate::{a, b::Thing};\n// crate::c in a comment\nfn f() { crate::d::g(); }\n\
         #[cfg(test)]\nmod tests { use crate::e; }",
    );
    assert_eq!(crate_paths(&code), ["a", "b::Thing", "d::g"]);
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, to)| (m.to_owned(), to.into_iter().map(str::to_owned).collect()))
    .collect();
    let found = circles(&graph);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0],
        ["a", "b", "c"].into_iter().map(str::to_owned).collect()
    );
}
