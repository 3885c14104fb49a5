//! The import scan behind `tests/layering.rs`: reads `src/`, strips comments and literals,
//! resolves every `crate::`/`super::`/`self::` path to the file that defines it, and finds
//! the cycles of the resulting file graph. Std only.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::Path;

/// Every `.rs` file under `src/`, as (path from the package root, text).
pub fn read_sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.strip_prefix(root).unwrap().to_string_lossy();
            let name = name.replace('\\', "/");
            if path.is_dir() {
                walk(&path, root, out);
            } else if name.ends_with(".rs") {
                out.push((name, fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    walk(&root.join("src"), root, &mut files);
    files
}

/// The module path a file defines: `src/lib.rs` is the root, `src/a/mod.rs` and `src/a.rs`
/// are `a`, `src/a/b.rs` is `a::b`.
fn module_of(file: &str) -> Vec<String> {
    let inner = file.strip_prefix("src/").expect("a file under src/");
    let inner = inner.strip_suffix(".rs").expect("a .rs file");
    let mut path: Vec<String> = inner.split('/').map(str::to_owned).collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
        path.pop();
    }
    path
}

/// The file-level import graph: for each file, the files it imports, each with the first
/// place that imports it (line and path).
pub struct Graph {
    pub edges: BTreeMap<String, BTreeMap<String, String>>,
}

impl Graph {
    pub fn build(files: &[(String, String)]) -> Graph {
        let modules: BTreeMap<Vec<String>, String> = files
            .iter()
            .map(|(file, _)| (module_of(file), file.clone()))
            .collect();
        let scanned: BTreeMap<String, Scan> = files
            .iter()
            .map(|(file, source)| (file.clone(), Scan::of(&module_of(file), source)))
            .collect();
        let resolver = Resolver {
            modules: &modules,
            scanned: &scanned,
        };
        let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (file, scan) in &scanned {
            let is_root = module_of(file).is_empty();
            let targets = edges.entry(file.clone()).or_default();
            for import in &scan.imports {
                // The root's `use`s are its re-exports, not imports.
                if is_root && import.in_use {
                    continue;
                }
                let Some(target) = resolver.file_of(&import.path) else {
                    continue;
                };
                if target != *file {
                    targets
                        .entry(target)
                        .or_insert_with(|| format!("line {}: {}", import.line, import.text));
                }
            }
        }
        Graph { edges }
    }

    /// Every cycle, one per strongly connected component of more than one file, each shown as
    /// its shortest circle through the component's first file, then every import inside it.
    pub fn cycles(&self) -> Vec<String> {
        let mut cycles = Vec::new();
        for component in self.components() {
            if component.len() < 2 {
                continue;
            }
            let start = component.iter().next().unwrap();
            // Shortest way back to `start` inside the component.
            let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = VecDeque::from([start.as_str()]);
            let mut last = None;
            'search: while let Some(file) = queue.pop_front() {
                for next in self.edges[file].keys() {
                    if !component.contains(next) {
                        continue;
                    }
                    if next == start {
                        last = Some(file);
                        break 'search;
                    }
                    if !came_from.contains_key(next.as_str()) {
                        came_from.insert(next, file);
                        queue.push_back(next);
                    }
                }
            }
            let mut way_back = Vec::new();
            let mut at = last.expect("a component of two or more files has a cycle");
            while at != start {
                way_back.push(at);
                at = came_from[at];
            }
            let mut circle = vec![start.as_str()];
            circle.extend(way_back.into_iter().rev());
            circle.push(start);
            let mut text = format!(
                "cycle through {} files: {}\n",
                component.len(),
                component.iter().cloned().collect::<Vec<_>>().join(", ")
            );
            text.push_str("  shortest circle:\n");
            for pair in circle.windows(2) {
                let why = &self.edges[pair[0]][pair[1]];
                text.push_str(&format!("    {} -> {}   ({why})\n", pair[0], pair[1]));
            }
            text.push_str("  every import inside it:\n");
            for from in &component {
                for (to, why) in &self.edges[from] {
                    if component.contains(to) {
                        text.push_str(&format!("    {from} -> {to}   ({why})\n"));
                    }
                }
            }
            cycles.push(text);
        }
        cycles
    }

    /// Strongly connected components (Kosaraju: finish order, then the reversed graph).
    fn components(&self) -> Vec<BTreeSet<String>> {
        fn finish<'g>(
            graph: &'g Graph,
            file: &'g str,
            seen: &mut BTreeSet<&'g str>,
            order: &mut Vec<&'g str>,
        ) {
            if !seen.insert(file) {
                return;
            }
            for next in graph.edges[file].keys() {
                finish(graph, next, seen, order);
            }
            order.push(file);
        }
        let mut seen = BTreeSet::new();
        let mut order = Vec::new();
        for file in self.edges.keys() {
            finish(self, file, &mut seen, &mut order);
        }
        let mut reversed: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (from, targets) in &self.edges {
            for to in targets.keys() {
                reversed.entry(to).or_default().push(from);
            }
        }
        let mut assigned = BTreeSet::new();
        let mut components = Vec::new();
        for &file in order.iter().rev() {
            if assigned.contains(file) {
                continue;
            }
            let mut component = BTreeSet::new();
            let mut stack = vec![file];
            assigned.insert(file);
            while let Some(at) = stack.pop() {
                component.insert(at.to_owned());
                for &from in reversed.get(at).into_iter().flatten() {
                    if assigned.insert(from) {
                        stack.push(from);
                    }
                }
            }
            components.push(component);
        }
        components
    }
}

/// Resolves absolute paths to files.
struct Resolver<'a> {
    modules: &'a BTreeMap<Vec<String>, String>,
    scanned: &'a BTreeMap<String, Scan>,
}

impl Resolver<'_> {
    /// The file defining what `path` (absolute, without `crate`) names: the file of its longest
    /// module prefix, or, when the next segment is a name that file re-exports from within the
    /// crate, wherever that leads.
    fn file_of(&self, path: &[String]) -> Option<String> {
        let mut path = path.to_vec();
        // Re-exports could in principle go round; a crate that compiles does not.
        for _ in 0..16 {
            let (length, file) = (0..=path.len())
                .rev()
                .find_map(|length| Some((length, self.modules.get(&path[..length])?)))?;
            let Some(name) = path.get(length) else {
                return Some(file.clone());
            };
            match self.scanned[file].reexports.get(name) {
                Some(target) => {
                    let mut next = target.clone();
                    next.extend_from_slice(&path[length + 1..]);
                    path = next;
                }
                None => return Some(file.clone()),
            }
        }
        None
    }
}

/// A path that names something of the crate, made absolute (module segments from the root).
struct Import {
    path: Vec<String>,
    line: usize,
    text: String,
    /// Whether it is part of a `use` item (as opposed to a path in code).
    in_use: bool,
}

/// What one file imports, and the names its `use` items bring in (possible re-exports).
struct Scan {
    imports: Vec<Import>,
    reexports: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

impl Scan {
    fn of(module: &[String], source: &str) -> Scan {
        let tokens = tokenize(&strip_comments_and_literals(source));
        let children = child_modules(&tokens);
        let mut scan = Scan {
            imports: Vec::new(),
            reexports: BTreeMap::new(),
        };
        // The module each token is in: the file's, or an inline `mod name { .. }` in it.
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0;
        let mut i = 0;
        while i < tokens.len() {
            let current = || {
                let mut current = module.to_vec();
                current.extend(inline.iter().map(|(name, _)| name.clone()));
                current
            };
            let resolve_here = |segments: &[String], current: &[String]| {
                absolute(segments, current, inline.is_empty().then_some(&children))
            };
            match &tokens[i].1 {
                Token::Punct('{') => depth += 1,
                Token::Punct('}') => {
                    depth -= 1;
                    if inline.last().is_some_and(|(_, at)| *at == depth) {
                        inline.pop();
                    }
                }
                Token::Ident(word) if word == "mod" => {
                    if let (Some((_, Token::Ident(name))), Some((_, Token::Punct('{')))) =
                        (tokens.get(i + 1), tokens.get(i + 2))
                    {
                        inline.push((name.clone(), depth));
                        depth += 1;
                        i += 3;
                        continue;
                    }
                }
                Token::Ident(word) if word == "use" => {
                    let line = tokens[i].0;
                    let end = (i..tokens.len())
                        .find(|&j| tokens[j].1 == Token::Punct(';'))
                        .unwrap_or(tokens.len());
                    let current = current();
                    for (segments, alias) in use_tree(&tokens[i + 1..end]) {
                        let Some(path) = resolve_here(&segments, &current) else {
                            continue;
                        };
                        if inline.is_empty() && segments.last().is_some_and(|s| s != "*") {
                            let name = alias.unwrap_or_else(|| path.last().unwrap().clone());
                            scan.reexports.insert(name, path.clone());
                        }
                        scan.imports.push(Import {
                            path,
                            line,
                            text: format!("use {}", segments.join("::")),
                            in_use: true,
                        });
                    }
                    i = end + 1;
                    continue;
                }
                Token::Ident(first) => {
                    let starts_path = i == 0 || tokens[i - 1].1 != Token::PathSep;
                    let mut segments = vec![first.clone()];
                    let mut j = i + 1;
                    while let (Some((_, Token::PathSep)), Some((_, Token::Ident(next)))) =
                        (tokens.get(j), tokens.get(j + 1))
                    {
                        segments.push(next.clone());
                        j += 2;
                    }
                    if starts_path && segments.len() > 1 {
                        if let Some(path) = resolve_here(&segments, &current()) {
                            scan.imports.push(Import {
                                path,
                                line: tokens[i].0,
                                text: segments.join("::"),
                                in_use: false,
                            });
                        }
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        scan
    }
}

/// Modules the file declares at its top level (`mod x;` or `mod x { .. }`).
fn child_modules(tokens: &[(usize, Token)]) -> BTreeSet<String> {
    let mut children = BTreeSet::new();
    let mut depth = 0;
    for (i, (_, token)) in tokens.iter().enumerate() {
        match token {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => depth -= 1,
            Token::Ident(word) if word == "mod" && depth == 0 => {
                if let Some((_, Token::Ident(name))) = tokens.get(i + 1) {
                    children.insert(name.clone());
                }
            }
            _ => {}
        }
    }
    children
}

/// `segments` made absolute from module `current`, if it names something of the crate:
/// starting at `crate`, `self`, `super` or (when `children` is given) a child module.
fn absolute(
    segments: &[String],
    current: &[String],
    children: Option<&BTreeSet<String>>,
) -> Option<Vec<String>> {
    let mut rest = segments;
    let mut path: Vec<String> = match segments.first()?.as_str() {
        "crate" => {
            rest = &segments[1..];
            Vec::new()
        }
        "self" => {
            rest = &segments[1..];
            current.to_vec()
        }
        "super" => {
            let mut path = current.to_vec();
            while rest.first().is_some_and(|s| s == "super") {
                path.pop()?;
                rest = &rest[1..];
            }
            path
        }
        first if children.is_some_and(|children| children.contains(first)) => current.to_vec(),
        _ => return None,
    };
    path.extend(rest.iter().filter(|s| *s != "self" && *s != "*").cloned());
    Some(path)
}

/// The paths of a `use` tree (the tokens between `use` and `;`), each with its alias.
fn use_tree(tokens: &[(usize, Token)]) -> Vec<(Vec<String>, Option<String>)> {
    fn walk(
        tokens: &[(usize, Token)],
        i: &mut usize,
        prefix: &[String],
        out: &mut Vec<(Vec<String>, Option<String>)>,
    ) {
        let mut path = prefix.to_vec();
        while *i < tokens.len() {
            match &tokens[*i].1 {
                Token::Ident(word) if word == "as" => {
                    if let Some((_, Token::Ident(alias))) = tokens.get(*i + 1) {
                        out.push((std::mem::take(&mut path), Some(alias.clone())));
                    }
                    *i += 2;
                }
                Token::Ident(word) if word == "pub" || word == "in" => *i += 1,
                Token::Ident(word) => {
                    path.push(word.clone());
                    *i += 1;
                }
                Token::Punct('*') => {
                    path.push("*".to_owned());
                    *i += 1;
                }
                Token::PathSep => *i += 1,
                Token::Punct('{') => {
                    *i += 1;
                    walk(tokens, i, &path, out);
                    path.clear();
                }
                Token::Punct(',') => {
                    if !path.is_empty() {
                        out.push((std::mem::take(&mut path), None));
                    }
                    *i += 1;
                    path = prefix.to_vec();
                }
                Token::Punct('}') => {
                    *i += 1;
                    break;
                }
                // `pub(crate) use`: the visibility's parentheses.
                Token::Punct(_) => *i += 1,
            }
        }
        if path.len() > prefix.len() {
            out.push((path, None));
        }
    }
    let mut out = Vec::new();
    let mut i = 0;
    walk(tokens, &mut i, &[], &mut out);
    out
}

/// Identifiers, `::` and single punctuation, each with its line.
fn tokenize(code: &str) -> Vec<(usize, Token)> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push((line, Token::Ident(chars[start..i].iter().collect())));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push((line, Token::PathSep));
            i += 2;
        } else {
            tokens.push((line, Token::Punct(c)));
            i += 1;
        }
    }
    tokens
}

/// `source` with comments, strings and character literals blanked (newlines kept, so lines
/// still count), lifetimes left alone.
fn strip_comments_and_literals(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |out: &mut String, skipped: &[char]| {
        out.extend(skipped.iter().filter(|c| **c == '\n'));
        out.push(' ');
    };
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        let at = |k: usize| rest.get(k).copied();
        let word_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if at(0) == Some('/') && at(1) == Some('/') {
            let end = rest.iter().position(|c| *c == '\n').unwrap_or(rest.len());
            i += end;
        } else if at(0) == Some('/') && at(1) == Some('*') {
            let mut nesting = 0;
            let mut k = 0;
            while k < rest.len() {
                if rest[k] == '/' && at(k + 1) == Some('*') {
                    nesting += 1;
                    k += 2;
                } else if rest[k] == '*' && at(k + 1) == Some('/') {
                    nesting -= 1;
                    k += 2;
                    if nesting == 0 {
                        break;
                    }
                } else {
                    k += 1;
                }
            }
            blank(&mut out, &rest[..k]);
            i += k;
        } else if !word_before
            && ((at(0) == Some('r') && matches!(at(1), Some('#' | '"')))
                || (at(0) == Some('b') && at(1) == Some('r') && matches!(at(2), Some('#' | '"'))))
        {
            // A raw string, or (`r#name`) a raw identifier.
            let start = if at(0) == Some('b') { 2 } else { 1 };
            let hashes = rest[start..].iter().take_while(|c| **c == '#').count();
            if at(start + hashes) != Some('"') {
                out.push_str("r#");
                i += 2;
                continue;
            }
            let body = start + hashes + 1;
            let mut k = body;
            let closes = |k: usize| {
                rest[k] == '"' && rest[k + 1..].iter().take_while(|c| **c == '#').count() >= hashes
            };
            while k < rest.len() && !closes(k) {
                k += 1;
            }
            let end = (k + 1 + hashes).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if at(0) == Some('"') || (!word_before && at(0) == Some('b') && at(1) == Some('"')) {
            let mut k = if at(0) == Some('b') { 2 } else { 1 };
            while k < rest.len() && rest[k] != '"' {
                k += if rest[k] == '\\' { 2 } else { 1 };
            }
            let end = (k + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if at(0) == Some('\'') && (at(1) == Some('\\') || at(2) == Some('\'')) {
            // A character literal (a lifetime has no closing quote right after one char).
            let mut k = 1;
            while k < rest.len() && rest[k] != '\'' {
                k += if rest[k] == '\\' { 2 } else { 1 };
            }
            let end = (k + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}
