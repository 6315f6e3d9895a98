//! `code`: source files split into symbols with tree-sitter: Rust's
//! functions, types, traits, macros and the methods of its `impl`s (inside
//! modules too), Python's functions, classes and methods. A symbol keeps
//! the doc comments, attributes and decorators just above it. Its id is
//! `path#symbol::path` (`.` between a Python class and its methods).

use serde_json::json;
use tree_sitter::{Node, Parser};

use super::documents::{Document, Piece, tidy_id};

/// The languages read, by file extension.
#[derive(Clone, Copy)]
enum Language {
    Rust,
    Python,
}

impl Language {
    fn of(path: &str) -> Option<Language> {
        match path.rsplit_once('.')?.1 {
            "rs" => Some(Language::Rust),
            "py" => Some(Language::Python),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
        }
    }

    fn grammar(self) -> tree_sitter::Language {
        match self {
            Language::Rust => tree_sitter_rust::LANGUAGE.into(),
            Language::Python => tree_sitter_python::LANGUAGE.into(),
        }
    }
}

/// A symbol found: its path, its kind and its node (whose range, widened
/// over the comments above it, is the unit's text).
struct Symbol<'t> {
    path: String,
    kind: &'static str,
    node: Node<'t>,
}

pub(super) fn split(doc: &Document, content: &[u8]) -> Result<Vec<Piece>, (String, String)> {
    let text = super::documents::as_text(content)?;
    let Some(language) = Language::of(&doc.path) else {
        return Err((
            "unsupported_language".to_owned(),
            "not a Rust (.rs) or Python (.py) file; narrow the glob".to_owned(),
        ));
    };
    let mut parser = Parser::new();
    parser.set_language(&language.grammar()).map_err(|e| {
        (
            "unreadable".to_owned(),
            format!("the {} grammar did not load: {e}", language.name()),
        )
    })?;
    let tree = parser.parse(text, None).ok_or_else(|| {
        (
            "unreadable".to_owned(),
            format!("the {} parser gave no tree", language.name()),
        )
    })?;
    let src = text.as_bytes();
    let mut symbols = Vec::new();
    match language {
        Language::Rust => rust_items(tree.root_node(), src, "", &mut symbols),
        Language::Python => python_items(tree.root_node(), src, &mut symbols),
    }
    Ok(symbols
        .into_iter()
        .map(|s| {
            let start = leading_start(s.node);
            let end = s.node.end_byte();
            let body = text.get(start..end).unwrap_or_default();
            let line = text
                .get(..start)
                .map_or(0, |b| b.bytes().filter(|&c| c == b'\n').count())
                + 1;
            let symbol = tidy_id(&s.path);
            Piece::unit(
                format!("{}#{symbol}", doc.path),
                json!({
                    "path": doc.path,
                    "language": language.name(),
                    "symbol": symbol,
                    "symbol_kind": s.kind,
                    "start": start,
                    "end": end,
                    "line": line,
                    "text": body,
                }),
                body.len() as u64,
            )
        })
        .collect())
}

fn named<'t>(node: Node<'t>) -> impl Iterator<Item = Node<'t>> {
    (0..node.named_child_count()).filter_map(move |i| node.named_child(i as u32))
}

fn text_of<'s>(node: Option<Node<'_>>, src: &'s [u8]) -> &'s str {
    node.and_then(|n| n.utf8_text(src).ok()).unwrap_or("?")
}

fn rust_items<'t>(scope: Node<'t>, src: &[u8], prefix: &str, out: &mut Vec<Symbol<'t>>) {
    for node in named(scope) {
        let name = || format!("{prefix}{}", text_of(node.child_by_field_name("name"), src));
        let kind = match node.kind() {
            "function_item" => "function",
            "struct_item" => "struct",
            "enum_item" => "enum",
            "union_item" => "union",
            "trait_item" => "trait",
            "macro_definition" => "macro",
            "mod_item" => {
                if let Some(body) = node.child_by_field_name("body") {
                    rust_items(body, src, &format!("{}::", name()), out);
                }
                continue;
            }
            "impl_item" => {
                let ty = text_of(node.child_by_field_name("type"), src);
                let owner = match node.child_by_field_name("trait") {
                    Some(t) => format!("<{ty} as {}>", text_of(Some(t), src)),
                    None => ty.to_owned(),
                };
                if let Some(body) = node.child_by_field_name("body") {
                    for item in named(body).filter(|n| n.kind() == "function_item") {
                        out.push(Symbol {
                            path: format!(
                                "{prefix}{owner}::{}",
                                text_of(item.child_by_field_name("name"), src)
                            ),
                            kind: "method",
                            node: item,
                        });
                    }
                }
                continue;
            }
            _ => continue,
        };
        out.push(Symbol {
            path: name(),
            kind,
            node,
        });
    }
}

fn python_items<'t>(module: Node<'t>, src: &[u8], out: &mut Vec<Symbol<'t>>) {
    for node in named(module) {
        let def = definition(node);
        match def.kind() {
            "function_definition" => out.push(Symbol {
                path: text_of(def.child_by_field_name("name"), src).to_owned(),
                kind: "function",
                node,
            }),
            "class_definition" => {
                let class = text_of(def.child_by_field_name("name"), src);
                let methods: Vec<Node<'t>> = def
                    .child_by_field_name("body")
                    .map(|b| {
                        named(b)
                            .filter(|n| definition(*n).kind() == "function_definition")
                            .collect()
                    })
                    .unwrap_or_default();
                if methods.is_empty() {
                    out.push(Symbol {
                        path: class.to_owned(),
                        kind: "class",
                        node,
                    });
                }
                for m in methods {
                    out.push(Symbol {
                        path: format!(
                            "{class}.{}",
                            text_of(definition(m).child_by_field_name("name"), src)
                        ),
                        kind: "method",
                        node: m,
                    });
                }
            }
            _ => {}
        }
    }
}

/// The definition a decorated definition wraps, or the node itself.
fn definition(node: Node<'_>) -> Node<'_> {
    match node.kind() {
        "decorated_definition" => node.child_by_field_name("definition").unwrap_or(node),
        _ => node,
    }
}

/// Where a symbol's text starts: the comments and attributes directly
/// above it (no blank line between) belong to it.
fn leading_start(node: Node<'_>) -> usize {
    let mut start = node;
    while let Some(prev) = start.prev_sibling() {
        let attached = matches!(
            prev.kind(),
            "line_comment" | "block_comment" | "attribute_item" | "comment"
        ) && prev.end_position().row + 1 >= start.start_position().row;
        if !attached {
            break;
        }
        start = prev;
    }
    start.start_byte()
}
