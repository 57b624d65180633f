//! The `Gpu` backends side by side: the symbolic and host backends agree on tags,
//! replies, digests and page copies, refuse the same out-of-range writes whole, and land
//! torn and corrupted payloads alike; the transfer digest and the traced write, from the
//! crate's public paths.

use kvsim_engine::env::Outbox;
use kvsim_engine::gpu::{
    digest_tokens, ids, query_position, write_traced, Gpu, HostGpu, KvPayload, SymbolicGpu,
    TagError, WriteError, WriteRefused, WriteTag,
};
use kvsim_engine::ids::{Generation, NodeId, PageId, PageTag, RoomKey, Token};
use kvsim_engine::trace::{NodeFault, TraceEvent};

/// The transfer digest binds each token to its position: the same tokens in
/// another order, or one token moved to the next slot, digest differently. (The
/// data faults only flip or drop contents; this is the check for reordering. The
/// chained hash gives it even without the position term.)
#[test]
fn the_digest_binds_tokens_to_their_positions() {
    let d = |t: &[Token]| digest_tokens(t.iter().copied());
    assert_ne!(d(&[7, 9]), d(&[9, 7]));
    assert_ne!(d(&[7, 7, 9]), d(&[7, 9, 9]));
    assert_ne!(d(&[0, 5]), d(&[5, 0]));
    assert_eq!(d(&[7, 9]), d(&[7, 9]));
}

/// The symbolic backend's page-by-page digest is the token-by-token one of
/// [`Gpu::digest`]'s definition: fewer positions than the pages hold, more (zeros
/// beyond them), and a page outside the memory (zeros), at every page size.
#[test]
fn the_page_by_page_digest_is_the_token_by_token_one() {
    for page_size in [1u32, 3, 16] {
        let mut sym = SymbolicGpu::new(4, page_size);
        let tags: Vec<PageTag> = (1..=4).map(tag).collect();
        let tokens: Vec<Token> = (0..4 * page_size).map(|i| 0x0002_0000 | i).collect();
        sym.write_tokens(&tags, 0, &tokens, RoomKey::new(1, 1))
            .unwrap();
        let pages = [PageId(2), PageId(99), PageId(4), PageId(1)];
        let ps = u64::from(page_size);
        for n in [0, 1, ps, ps + 1, 3 * ps - 1, 4 * ps, 4 * ps + 5] {
            let by_token = (0..n).map(|pos| sym.token_at(&pages, pos).unwrap());
            assert_eq!(
                sym.digest(&pages, n).unwrap(),
                digest_tokens(by_token),
                "page size {page_size}, {n} positions"
            );
        }
    }
}

const PAGE_SIZES: [u32; 7] = [1, 2, 3, 4, 8, 16, 64];
const A: RoomKey = RoomKey::new(1, 1);
const B: RoomKey = RoomKey::new(2, 1);

fn tag(p: u32) -> PageTag {
    PageTag {
        page: PageId(p),
        gen: Generation(1),
    }
}

fn tag_of(room: RoomKey) -> Option<WriteTag> {
    Some(WriteTag {
        room,
        gen: Generation(1),
    })
}

/// Both backends after the same writes: room A fills pages 3-5, then room B is
/// given pages 4-6 and writes only one token (the incident's stub), so pages 4 and
/// 5 hold A's stale KV and page 6 was never written.
struct TwoRooms {
    sym: SymbolicGpu,
    host: HostGpu,
    a_tags: [PageTag; 3],
    b_tags: [PageTag; 3],
    a_tokens: Vec<Token>,
}

fn two_rooms(page_size: u32) -> TwoRooms {
    let mut sym = SymbolicGpu::new(8, page_size);
    let mut host = HostGpu::new(8, page_size);
    let a_tags = [tag(3), tag(4), tag(5)];
    let a_tokens: Vec<Token> = (0..(3 * page_size)).map(|i| 0x0001_0000 | i).collect();
    sym.write_tokens(&a_tags, 0, &a_tokens, A).unwrap();
    host.write_tokens(&a_tags, 0, &a_tokens, A).unwrap();
    let b_tags = [tag(4), tag(5), tag(6)];
    sym.write_tokens(&b_tags, 0, &[0xBEEF], B).unwrap();
    host.write_tokens(&b_tags, 0, &[0xBEEF], B).unwrap();
    TwoRooms {
        sym,
        host,
        a_tags,
        b_tags,
        a_tokens,
    }
}

/// Both backends stamp the same tags: A's first page is still A's, B's first page
/// is B's, B's second page still carries A's tag (B never wrote it).
#[test]
fn symbolic_and_host_agree_on_tags() {
    for page_size in PAGE_SIZES {
        let w = two_rooms(page_size);
        for gpu in [&w.sym as &dyn TagView, &w.host] {
            assert_eq!(gpu.tag_of(PageId(3)), tag_of(A));
            assert_eq!(gpu.tag_of(PageId(4)), tag_of(B));
            assert_eq!(gpu.tag_of(PageId(5)), tag_of(A));
        }
        assert!(w.sym.check_tags(&w.a_tags[..1], A).is_ok());
        let err = w.sym.check_tags(&w.b_tags, B).unwrap_err();
        assert!(
            matches!(err, TagError::Mismatch(m) if m.expected == tag(5)),
            "{err}"
        );
    }
}

/// Both backends give the same reply for the same writes, including pages that
/// hold another room's stale KV and slots never written.
#[test]
fn symbolic_and_host_agree() {
    for page_size in PAGE_SIZES {
        let w = two_rooms(page_size);
        let (a_pages, b_pages) = (ids(&w.a_tags), ids(&w.b_tags));
        let seq = 3 * u64::from(page_size);
        for pages in [&a_pages, &b_pages] {
            for q in 0..seq {
                assert_eq!(
                    w.sym.attend(pages, seq, q).unwrap(),
                    w.host.attend(pages, seq, q).unwrap(),
                    "page_size {page_size} q {q}"
                );
                assert_eq!(
                    w.sym.token_at(pages, q).unwrap(),
                    w.host.token_at(pages, q).unwrap()
                );
            }
            assert_eq!(
                w.sym.digest(pages, seq).unwrap(),
                w.host.digest(pages, seq).unwrap()
            );
        }
        // The stale slots of page 4 still echo A's tokens through B's sequence.
        if page_size > 1 {
            assert_eq!(
                w.sym.attend(&b_pages, seq, 1).unwrap(),
                w.a_tokens[page_size as usize + 1]
            );
        }
    }
}

/// Copying a page moves its contents; the receiver stamps its own tag.
#[test]
fn symbolic_and_host_agree_on_a_page_copy() {
    for page_size in PAGE_SIZES {
        let TwoRooms {
            mut sym, mut host, ..
        } = two_rooms(page_size);
        let kv = sym.read_page(PageId(3)).unwrap();
        sym.write_page(tag(7), B, &kv).unwrap();
        let hkv = host.read_page(PageId(3)).unwrap();
        host.write_page(tag(7), B, &hkv).unwrap();
        assert_eq!(sym.page_tag(PageId(7)).unwrap(), tag_of(B));
        assert_eq!(
            sym.attend(&[PageId(7)], 1, 0).unwrap(),
            host.attend(&[PageId(7)], 1, 0).unwrap()
        );
    }
}

trait TagView {
    fn tag_of(&self, page: PageId) -> Option<WriteTag>;
}
impl<G: Gpu> TagView for G {
    fn tag_of(&self, page: PageId) -> Option<WriteTag> {
        self.page_tag(page).unwrap()
    }
}

/// Both backends refuse a write that runs past its page list or names a page
/// outside the pool, whole: nothing of it lands (not even the slots that would
/// fit), and `write_traced` states the refusal instead of a `KvWritten`.
#[test]
fn every_backend_refuses_a_write_past_its_pages_whole() {
    fn check<G: Gpu>(mut gpu: G) {
        let room = RoomKey::new(1, 1);
        let tag = |p: u32| PageTag {
            page: PageId(p),
            gen: Generation(1),
        };
        let pages = [tag(2), tag(3)];
        // Four slots; five tokens is one too many, at any start.
        for (start, n) in [(0u64, 5usize), (3, 2), (4, 1), (1, 4)] {
            let tokens: Vec<Token> = (0..n as u32).map(|i| 0x0002_0000 | i).collect();
            let err = gpu.write_tokens(&pages, start, &tokens, room).unwrap_err();
            assert!(
                matches!(err, WriteError::Refused(WriteRefused::PastPageList { .. })),
                "{err}"
            );
            assert_eq!(
                gpu.page_tag(PageId(2)).unwrap(),
                None,
                "a refused write stamped a tag"
            );
            assert_eq!(gpu.token_at(&ids(&pages), start.min(3)).unwrap(), 0);
        }
        // Exactly the capacity is fine.
        gpu.write_tokens(&pages, 3, &[7], room).unwrap();
        assert_eq!(gpu.token_at(&ids(&pages), 3).unwrap(), 7);
        // A page outside the pool (or the padding page) is refused, by both paths.
        for bad in [0u32, 9] {
            let err = gpu.write_tokens(&[tag(bad)], 0, &[1], room).unwrap_err();
            assert_eq!(
                err,
                WriteError::Refused(WriteRefused::NotAPoolPage { page: bad, pool: 4 })
            );
            let kv = gpu.read_page(PageId(2)).unwrap();
            assert!(gpu.write_page(tag(bad), room, &kv).is_err());
        }
        let mut out: Outbox<G::Kv> = Outbox::new(0);
        let r = write_traced(&mut gpu, &mut out, NodeId(3), &pages, 4, &[1], room);
        assert!(r.is_err());
        let evs: Vec<&TraceEvent> = out.traces().collect();
        assert!(
            matches!(
                evs.as_slice(),
                [TraceEvent::Fault {
                    fault: NodeFault::WriteRefused { .. },
                    ..
                }]
            ),
            "{evs:?}"
        );
    }
    check(SymbolicGpu::new(4, 2));
    check(HostGpu::new(4, 2));
}

/// A torn payload lands its leading slots only, the rest keep their contents; a
/// corrupted one decodes to another token in one slot. Both backends alike.
#[test]
fn torn_and_corrupted_payloads_land_as_stated() {
    fn check<G: Gpu>(mut gpu: G) {
        let (a, b) = (RoomKey::new(1, 1), RoomKey::new(2, 1));
        let tag = |p: u32| PageTag {
            page: PageId(p),
            gen: Generation(1),
        };
        let old: Vec<Token> = (0..4).map(|i| 0x0001_0000 | i).collect();
        let new: Vec<Token> = (0..4).map(|i| 0x0002_0000 | i).collect();
        gpu.write_tokens(&[tag(1)], 0, &old, a).unwrap();
        gpu.write_tokens(&[tag(2)], 0, &new, b).unwrap();
        let mut kv = gpu.read_page(PageId(2)).unwrap();
        kv.tear();
        gpu.write_page(tag(1), b, &kv).unwrap();
        let got: Vec<Token> = (0..4)
            .map(|q| gpu.token_at(&[PageId(1)], q).unwrap())
            .collect();
        assert_eq!(got, vec![new[0], new[1], old[2], old[3]]);
        let mut kv = gpu.read_page(PageId(2)).unwrap();
        kv.corrupt(0x0000_0001_0000_0002);
        gpu.write_page(tag(3), b, &kv).unwrap();
        let got: Vec<Token> = (0..4)
            .map(|q| gpu.token_at(&[PageId(3)], q).unwrap())
            .collect();
        let differ = got.iter().zip(&new).filter(|(x, y)| x != y).count();
        assert_eq!(differ, 1, "{got:x?}");
        assert_eq!(got[2], new[2] ^ 2);
    }
    check(SymbolicGpu::new(4, 4));
    check(HostGpu::new(4, 4));
}

#[test]
fn query_positions_cover_the_prompt() {
    assert_eq!(query_position(0, 4, 100), 0);
    assert_eq!(query_position(3, 4, 100), 99);
    assert_eq!(query_position(0, 1, 100), 0);
    assert_eq!(query_position(5, 1, 1), 0);
}
