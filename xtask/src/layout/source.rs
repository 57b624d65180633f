//! One production file's figures: its function lengths and its `pub` items.
//!
//! It is not the module graph (`graph.rs`) and reads no other file. Test code, a
//! `#[cfg(test)]` item or a `#[test]` function, is skipped whole, nested items included,
//! so that a long test never counts against the production limits.

use syn::visit::{self, Visit};
use syn::{Attribute, Block, Signature, Visibility};

/// One function's length: lines from its `fn` line to its closing brace, both counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnLen {
    /// `name` for a free function, `Type::name` for a method in an impl or a trait.
    pub name: String,
    /// The line of `fn`, 1-based.
    pub line: usize,
    pub lines: usize,
}

/// What one file holds outside its tests.
#[derive(Debug, Default)]
pub struct Figures {
    pub fns: Vec<FnLen>,
    /// Items declared `pub` (without a restriction).
    pub pub_items: usize,
    /// Items declared `pub(crate)`.
    pub pub_crate_items: usize,
}

/// The figures of a parsed file.
pub fn figures(file: &syn::File) -> Figures {
    let mut v = FigureVisitor::default();
    v.visit_file(file);
    v.out
}

/// Whether attributes mark test-only code: `#[cfg(test)]`, `#[test]`, `#[tokio::test]`.
pub fn is_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        if path.segments.last().is_some_and(|s| s.ident == "test") {
            return true;
        }
        path.is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string() == "test")
    })
}

#[derive(Default)]
struct FigureVisitor {
    out: Figures,
    /// The type of the impl or the name of the trait being walked, if any.
    owner: Vec<String>,
}

impl FigureVisitor {
    fn count_vis(&mut self, vis: &Visibility) {
        match vis {
            Visibility::Public(_) => self.out.pub_items += 1,
            Visibility::Restricted(r) if r.path.is_ident("crate") && r.in_token.is_none() => {
                self.out.pub_crate_items += 1
            }
            _ => {}
        }
    }

    fn record(&mut self, sig: &Signature, block: &Block) {
        let line = sig.fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        let name = match self.owner.last() {
            Some(owner) => format!("{owner}::{}", sig.ident),
            None => sig.ident.to_string(),
        };
        self.out.fns.push(FnLen {
            name,
            line,
            lines: end + 1 - line,
        });
    }
}

/// The last identifier of a type, for naming methods (`impl Foo<T>` gives `Foo`).
fn type_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map_or_else(|| "_".to_string(), |s| s.ident.to_string()),
        syn::Type::Reference(r) => type_name(&r.elem),
        _ => "_".to_string(),
    }
}

impl<'ast> Visit<'ast> for FigureVisitor {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let (attrs, vis) = item_attrs_vis(item);
        if is_test(attrs) {
            return;
        }
        if let Some(vis) = vis {
            self.count_vis(vis);
        }
        visit::visit_item(self, item);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        // A free function inside a method body is free: it has no owner.
        let saved = std::mem::take(&mut self.owner);
        self.record(&f.sig, &f.block);
        visit::visit_item_fn(self, f);
        self.owner = saved;
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        self.owner.push(type_name(&i.self_ty));
        visit::visit_item_impl(self, i);
        self.owner.pop();
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.owner.push(t.ident.to_string());
        visit::visit_item_trait(self, t);
        self.owner.pop();
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let (attrs, vis) = match item {
            syn::ImplItem::Fn(f) => (&f.attrs, Some(&f.vis)),
            syn::ImplItem::Const(c) => (&c.attrs, Some(&c.vis)),
            syn::ImplItem::Type(t) => (&t.attrs, Some(&t.vis)),
            _ => return visit::visit_impl_item(self, item),
        };
        if is_test(attrs) {
            return;
        }
        if let Some(vis) = vis {
            self.count_vis(vis);
        }
        visit::visit_impl_item(self, item);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.record(&f.sig, &f.block);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        if let Some(block) = &f.default {
            self.record(&f.sig, block);
        }
        visit::visit_trait_item_fn(self, f);
    }
}

/// An item's attributes and, where it has one, its visibility.
fn item_attrs_vis(item: &syn::Item) -> (&[Attribute], Option<&Visibility>) {
    use syn::Item as I;
    match item {
        I::Const(i) => (&i.attrs, Some(&i.vis)),
        I::Enum(i) => (&i.attrs, Some(&i.vis)),
        I::ExternCrate(i) => (&i.attrs, Some(&i.vis)),
        I::Fn(i) => (&i.attrs, Some(&i.vis)),
        I::ForeignMod(i) => (&i.attrs, None),
        I::Impl(i) => (&i.attrs, None),
        I::Macro(i) => (&i.attrs, None),
        I::Mod(i) => (&i.attrs, Some(&i.vis)),
        I::Static(i) => (&i.attrs, Some(&i.vis)),
        I::Struct(i) => (&i.attrs, Some(&i.vis)),
        I::Trait(i) => (&i.attrs, Some(&i.vis)),
        I::TraitAlias(i) => (&i.attrs, Some(&i.vis)),
        I::Type(i) => (&i.attrs, Some(&i.vis)),
        I::Union(i) => (&i.attrs, Some(&i.vis)),
        I::Use(i) => (&i.attrs, Some(&i.vis)),
        _ => (&[], None),
    }
}
