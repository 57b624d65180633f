//! The module graph of one crate: a node per source file, an arrow A -> B when A names
//! an item of B, and its cycles (strongly connected components of more than one file).
//!
//! It is not rustc's name resolution: a path is resolved by where files lie, to the
//! deepest module file that exists, and a path that does not start at `crate`, `self`,
//! `super` or a child module of the file is taken to leave the crate and draws no arrow.
//! `mod x;` alone draws no arrow, and an arrow from a file to itself is dropped.

use proc_macro2::{TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet};
use syn::visit::{self, Visit};

/// One source file of a crate, placed in its module tree.
pub struct Node<'a> {
    /// Path from the workspace root, for the report.
    pub path: String,
    /// Which crate root's tree it belongs to: `lib`, `main` or `bin/NAME`.
    pub tree: String,
    /// Its module path from that root (`[]` for the root file itself).
    pub module: Vec<String>,
    pub file: &'a syn::File,
}

/// A cycle: its files and the arrows that tie them, each with the names it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    pub files: Vec<String>,
    pub arrows: Vec<(String, String, Vec<String>)>,
}

/// Arrows between file indices, each with the names that draw it.
type Arrows = BTreeMap<(usize, usize), BTreeSet<String>>;

/// The cycles among `nodes`, in a stable order.
pub fn cycles(nodes: &[Node]) -> Vec<Cycle> {
    let index: BTreeMap<(&str, &[String]), usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| ((n.tree.as_str(), n.module.as_slice()), i))
        .collect();
    let mut arrows = Arrows::new();
    for (from, node) in nodes.iter().enumerate() {
        let mut walker = Walker {
            index: &index,
            node,
            from,
            inline: Vec::new(),
            arrows: &mut arrows,
        };
        walker.visit_file(node.file);
    }
    let mut out = Vec::new();
    for scc in strongly_connected(nodes.len(), &arrows) {
        if scc.len() < 2 {
            continue;
        }
        let members: BTreeSet<usize> = scc.iter().copied().collect();
        let tie = arrows
            .iter()
            .filter(|((a, b), _)| members.contains(a) && members.contains(b))
            .map(|((a, b), names)| {
                let names = names.iter().cloned().collect();
                (nodes[*a].path.clone(), nodes[*b].path.clone(), names)
            })
            .collect();
        let mut files: Vec<String> = scc.iter().map(|&i| nodes[i].path.clone()).collect();
        files.sort();
        out.push(Cycle { files, arrows: tie });
    }
    out.sort_by(|a, b| a.files.cmp(&b.files));
    out
}

/// Walks one file, drawing an arrow for every path it writes.
struct Walker<'a, 'n> {
    index: &'a BTreeMap<(&'a str, &'a [String]), usize>,
    node: &'a Node<'n>,
    from: usize,
    /// The inline `mod x { }` blocks around the current item.
    inline: Vec<String>,
    arrows: &'a mut Arrows,
}

impl Walker<'_, '_> {
    /// Resolve `segs` (written in the current module) and draw its arrow, if any.
    fn path(&mut self, segs: &[String]) {
        let Some(first) = segs.first() else { return };
        let mut base: Vec<String> = self.node.module.clone();
        base.extend(self.inline.iter().cloned());
        let rest = match first.as_str() {
            "crate" | "$crate" => {
                base.clear();
                &segs[1..]
            }
            "self" => &segs[1..],
            "super" => {
                let supers = segs.iter().take_while(|s| *s == "super").count();
                for _ in 0..supers {
                    base.pop();
                }
                &segs[supers..]
            }
            _ if segs.len() > 1 && self.is_module(&[base.clone(), vec![first.clone()]]) => segs,
            _ => return,
        };
        base.extend(rest.iter().filter(|s| *s != "*").cloned());
        let target = (0..=base.len())
            .rev()
            .find_map(|n| self.index.get(&(self.node.tree.as_str(), &base[..n])));
        if let Some(&to) = target {
            if to != self.from {
                let name = segs.last().cloned().unwrap_or_default();
                self.arrows.entry((self.from, to)).or_default().insert(name);
            }
        }
    }

    /// Whether the module path made of `parts` is a file of this tree.
    fn is_module(&self, parts: &[Vec<String>]) -> bool {
        let path: Vec<String> = parts.concat();
        self.index
            .contains_key(&(self.node.tree.as_str(), path.as_slice()))
    }

    /// Paths written inside a macro's tokens: `crate::a::f`, `super::X`.
    fn tokens(&mut self, tokens: TokenStream) {
        let mut flat = Vec::new();
        flatten(tokens, &mut flat);
        let mut i = 0;
        while i < flat.len() {
            let mut segs = Vec::new();
            let mut j = i;
            while let Some(FlatTok::Ident(id)) = flat.get(j) {
                segs.push(id.clone());
                if flat.get(j + 1) == Some(&FlatTok::PathSep) {
                    j += 2;
                } else {
                    j += 1;
                    break;
                }
            }
            if matches!(
                segs.first().map(String::as_str),
                Some("crate" | "self" | "super")
            ) && segs.len() > 1
            {
                self.path(&segs);
            }
            i = j.max(i + 1);
        }
    }
}

#[derive(PartialEq, Eq)]
enum FlatTok {
    Ident(String),
    PathSep,
    Other,
}

/// Tokens without their groups, `::` as one token.
fn flatten(tokens: TokenStream, out: &mut Vec<FlatTok>) {
    let mut iter = tokens.into_iter().peekable();
    while let Some(t) = iter.next() {
        match t {
            TokenTree::Group(g) => {
                out.push(FlatTok::Other);
                flatten(g.stream(), out);
                out.push(FlatTok::Other);
            }
            TokenTree::Ident(id) => out.push(FlatTok::Ident(id.to_string())),
            TokenTree::Punct(p) if p.as_char() == ':' => {
                if matches!(iter.peek(), Some(TokenTree::Punct(q)) if q.as_char() == ':') {
                    iter.next();
                    out.push(FlatTok::PathSep);
                } else {
                    out.push(FlatTok::Other);
                }
            }
            TokenTree::Punct(p) if p.as_char() == '$' => {
                if let Some(TokenTree::Ident(id)) = iter.peek() {
                    if id == "crate" {
                        iter.next();
                        out.push(FlatTok::Ident("crate".to_string()));
                        continue;
                    }
                }
                out.push(FlatTok::Other);
            }
            _ => out.push(FlatTok::Other),
        }
    }
}

/// Every path a `use` tree names, with `*` for a glob and `self` folded into its prefix.
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => out.push(prefix.clone()),
        syn::UseTree::Name(n) => out.push([prefix.clone(), vec![n.ident.to_string()]].concat()),
        syn::UseTree::Rename(r) => out.push([prefix.clone(), vec![r.ident.to_string()]].concat()),
        syn::UseTree::Glob(_) => out.push([prefix.clone(), vec!["*".to_string()]].concat()),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, out);
            }
        }
    }
}

impl<'ast> Visit<'ast> for Walker<'_, '_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_some() {
            return;
        }
        let mut paths = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut paths);
        for p in paths {
            self.path(&p);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.inline.push(m.ident.to_string());
            visit::visit_item_mod(self, m);
            self.inline.pop();
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.path(&segs);
        }
        visit::visit_path(self, p);
    }

    /// `pub(crate)` and `pub(super)` name a scope, not an item: no arrow.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        visit::visit_macro(self, m);
    }
}

/// Tarjan's strongly connected components of the graph on `0..n`.
fn strongly_connected(n: usize, arrows: &Arrows) -> Vec<Vec<usize>> {
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in arrows.keys() {
        next[a].push(b);
    }
    let mut t = Tarjan {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        count: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    t.out
}

struct Tarjan {
    next: Vec<Vec<usize>>,
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    count: usize,
    out: Vec<Vec<usize>>,
}

impl Tarjan {
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.count);
        self.low[v] = self.count;
        self.count += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for w in self.next[v].clone() {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            self.out.push(scc);
        }
    }
}
