//! The import graph of cube-manager's files: no file may reach itself through `crate::X`
//! references (use statements and paths alike, macro arguments included). A circle between
//! files means neither can be understood, tested or moved without the other; issue 30 breaks
//! them by giving each part its own state instead of the whole `Manager`.
//!
//! Test code is left out (`#[cfg(test)]` items): a unit test may well build a `Manager`.
//! The circles that remain are listed, exactly, in [`STILL_CIRCULAR`].

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// The circles still among cube-manager's files, each from its alphabetically first file
/// ("a -> b -> a").
///
/// This list may only shrink: a new circle fails the test, and so does an entry that is no
/// longer a circle (take it off). It is empty since issue 30 gave `acl.rs`, `tls.rs`,
/// `metrics.rs` and `events.rs` state of their own and moved the pieces two files shared
/// (`copies.rs`, `queue::QueueDirty`); keep it so. The controllers-as-values work of that issue
/// goes further: files that still import `manager.rs` do so one way only.
const STILL_CIRCULAR: &[&str] = &[];

/// Which files a graph is made of: file name (without `.rs`) to its source.
type Sources = BTreeMap<String, String>;

/// Every module `source` names through `crate::X` outside of test code, among `modules`.
fn references(source: &str, modules: &BTreeSet<String>) -> Result<BTreeSet<String>, String> {
    let stream = TokenStream::from_str(source).map_err(|err| err.to_string())?;
    let mut found = BTreeSet::new();
    walk(stream, modules, &mut found);
    Ok(found)
}

fn walk(stream: TokenStream, modules: &BTreeSet<String>, found: &mut BTreeSet<String>) {
    let tokens: Vec<TokenTree> = stream.into_iter().collect();
    let mut at = 0;
    while at < tokens.len() {
        if is_cfg_test(&tokens, at) {
            // Skip the attribute and the item it marks: up to its body or its `;`.
            at += 2;
            while at < tokens.len() {
                let end = match &tokens[at] {
                    TokenTree::Group(group) => group.delimiter() == Delimiter::Brace,
                    TokenTree::Punct(punct) => punct.as_char() == ';',
                    _ => false,
                };
                at += 1;
                if end {
                    break;
                }
            }
            continue;
        }
        match &tokens[at] {
            TokenTree::Ident(ident) if ident == "crate" && is_path_separator(&tokens, at + 1) => {
                match tokens.get(at + 3) {
                    Some(TokenTree::Ident(name)) => {
                        let name = name.to_string();
                        if modules.contains(&name) {
                            found.insert(name);
                        }
                    }
                    // `use crate::{a, b::C};`: the first name of each branch.
                    Some(TokenTree::Group(group)) if group.delimiter() == Delimiter::Brace => {
                        let mut first = true;
                        for token in group.stream() {
                            match token {
                                TokenTree::Ident(name) if first => {
                                    let name = name.to_string();
                                    if modules.contains(&name) {
                                        found.insert(name);
                                    }
                                    first = false;
                                }
                                TokenTree::Punct(punct) if punct.as_char() == ',' => first = true,
                                _ => first = false,
                            }
                        }
                    }
                    _ => {}
                }
                at += 3;
            }
            TokenTree::Group(group) => {
                walk(group.stream(), modules, found);
                at += 1;
            }
            _ => at += 1,
        }
    }
}

/// `#[cfg(test)]` at `at`.
fn is_cfg_test(tokens: &[TokenTree], at: usize) -> bool {
    let (Some(TokenTree::Punct(hash)), Some(TokenTree::Group(group))) =
        (tokens.get(at), tokens.get(at + 1))
    else {
        return false;
    };
    hash.as_char() == '#'
        && group.delimiter() == Delimiter::Bracket
        && group.stream().to_string().replace(' ', "") == "cfg(test)"
}

/// `::` at `at`.
fn is_path_separator(tokens: &[TokenTree], at: usize) -> bool {
    matches!(
        (tokens.get(at), tokens.get(at + 1)),
        (Some(TokenTree::Punct(first)), Some(TokenTree::Punct(second)))
            if first.as_char() == ':' && first.spacing() == Spacing::Joint && second.as_char() == ':'
    )
}

/// Each file and the files it names.
fn graph(sources: &Sources) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let modules: BTreeSet<String> = sources.keys().cloned().collect();
    sources
        .iter()
        .map(|(name, source)| {
            let mut named =
                references(source, &modules).map_err(|err| format!("{name}.rs: {err}"))?;
            named.remove(name);
            Ok((name.clone(), named))
        })
        .collect()
}

/// Every elementary circle of `graph`, each written from its alphabetically first file
/// ("a -> b -> a"), sorted.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn extend(
        graph: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        path: &mut Vec<String>,
        found: &mut Vec<String>,
    ) {
        let last = path.last().cloned().unwrap_or_default();
        for next in graph.get(&last).into_iter().flatten() {
            if next == start {
                found.push(format!("{} -> {start}", path.join(" -> ")));
            } else if next.as_str() > start && !path.contains(next) {
                path.push(next.clone());
                extend(graph, start, path, found);
                path.pop();
            }
        }
    }
    let mut found = Vec::new();
    for start in graph.keys() {
        extend(graph, start, &mut vec![start.clone()], &mut found);
    }
    found.sort();
    found
}

/// What is wrong with `found` against `allowed`: each new circle and each listed one that
/// is gone.
fn complaints(found: &[String], allowed: &[&str]) -> Vec<String> {
    let mut complaints: Vec<String> = found
        .iter()
        .filter(|cycle| !allowed.contains(&cycle.as_str()))
        .map(|cycle| format!("a circle among cube-manager's files: {cycle}"))
        .collect();
    complaints.extend(
        allowed
            .iter()
            .filter(|cycle| !found.iter().any(|found| found == *cycle))
            .map(|cycle| {
                format!("STILL_CIRCULAR lists {cycle}, which is no longer a circle: take it off")
            }),
    );
    complaints
}

#[test]
fn cube_managers_files_import_each_other_in_no_circle_but_the_listed_ones() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = Sources::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            if name != "lib" {
                sources.insert(name, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    assert!(sources.contains_key("manager"), "no manager.rs in {dir:?}");
    let found = cycles(&graph(&sources).unwrap());
    let complaints = complaints(&found, STILL_CIRCULAR);
    assert!(
        complaints.is_empty(),
        "{}\n(break a circle by giving one side what it needs as a value or through a narrow \
         trait, or by moving the shared piece to where both can import it one way)",
        complaints.join("\n")
    );
}

fn sources(files: &[(&str, &str)]) -> Sources {
    files
        .iter()
        .map(|(name, source)| (name.to_string(), source.to_string()))
        .collect()
}

#[test]
fn a_circle_through_uses_paths_and_macros_is_named_and_test_code_is_not_counted() {
    let files = sources(&[
        ("a", "use crate::{b, other::Thing};\nfn f() {}"),
        ("b", "fn g() { let _ = format!(\"{}\", crate::c::hex(1)); }"),
        ("c", "pub fn hex() {}\nfn h() -> crate::a::T { todo!() }"),
        (
            "d",
            "#[cfg(test)]\nmod tests { use crate::a::f; }\n#[cfg(test)]\nuse crate::b;\n\
             /// Not [`crate::a`] either.\nfn i() {}",
        ),
        ("e", "use crate::a::f; use crate::d;"),
    ]);
    let graph = graph(&files).unwrap();
    assert_eq!(graph["d"], BTreeSet::new());
    assert_eq!(
        graph["e"],
        ["a", "d"].iter().map(|name| name.to_string()).collect()
    );
    let found = cycles(&graph);
    assert_eq!(found, ["a -> b -> c -> a"]);
    assert_eq!(
        complaints(&found, &[]),
        ["a circle among cube-manager's files: a -> b -> c -> a"]
    );
    assert!(complaints(&found, &["a -> b -> c -> a"]).is_empty());
}

#[test]
fn every_circle_is_named_once_and_a_listed_circle_that_is_gone_fails_too() {
    let files = sources(&[
        ("manager", "use crate::acl::Acl; use crate::tls::Tls;"),
        ("acl", "use crate::manager::Manager; use crate::tls::check;"),
        ("tls", "use crate::manager::Manager; use crate::acl::hex;"),
    ]);
    let found = cycles(&graph(&files).unwrap());
    assert_eq!(
        found,
        [
            "acl -> manager -> acl",
            "acl -> manager -> tls -> acl",
            "acl -> tls -> acl",
            "acl -> tls -> manager -> acl",
            "manager -> tls -> manager",
        ]
    );
    let mut allowed: Vec<&str> = found.iter().map(String::as_str).collect();
    allowed.push("manager -> events -> manager");
    assert_eq!(
        complaints(&found, &allowed),
        [
            "STILL_CIRCULAR lists manager -> events -> manager, which is no longer a circle: take \
          it off"
        ]
    );
}
