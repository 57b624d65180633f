# Writes the traces of docs/trace-conformance/ and expected.toml: each case is a few
# lines naming its entries. An authoring aid: the .jsonl files and expected.toml are the
# suite (cargo test reads them, never this script). Edit a case here and rerun
# `python3 docs/trace-conformance/cases.py` to rewrite them all.
import json, copy, os
OUT=os.path.dirname(os.path.abspath(__file__))
def R(r,g=1): return {"room":r,"gen":g}
def T(p,g=1): return {"page":p,"gen":g}
def W(room,c=0,writer=1,epoch=0): return {"writer":writer,"epoch":epoch,"room":room,"chunk":c}
A=R(1); B=R(2); C=R(3)
BASEH={"type":"header","schema_version":2,"source":"hand-written","clock":"simulated","page_size":4,"context_len":64,
 "allow_auto_truncate":False,"chunk_pages":4,"max_inflight_chunks":2,
 "defenses":{"admission_check":True,"verify_on_completion":True,"deferred_release":True,"page_tags":True,"landing_gate":True,"preflight":True,"router_cancels_both":True,"zero_on_free":False},
 "bugs":[],"nodes":[{"id":0,"role":"Router"},{"id":1,"role":"Prefill","pool_pages":16},{"id":2,"role":"Decode","pool_pages":8}],
 "client":3,"canary_tokens":False,"echo_replies":False}
def hdr(**kw):
    h=copy.deepcopy(BASEH)
    for k,v in kw.items():
        if k=='pools':
            h['nodes'][1]['pool_pages'],h['nodes'][2]['pool_pages']=v
        else: h[k]=v
    return h
def E(ev,node,**f): return ("engine",dict(event=ev,node=node,**f))
def X(t,**f): return (t,f)
def routed(room=A,req=0,prompt=6,maxn=2,prefill=1,decode=2): return E("Routed",0,req=req,tenant=1,room=room,prefill=prefill,decode=decode,prompt_len=prompt,max_new_tokens=maxn)
def reserve(node,room,pages): return E("PagesReserved",node,room=room,pages=pages)
def release(node,room,pages,held=(),how="Owner"): return E("PagesReleased",node,room=room,pages=pages,how=how,held=list(held))
def sent(room,src,dst,c=0,to=2,epoch=0):
    f=dict(write=W(room,c,epoch=epoch),src=src,dst=dst)
    if to is not None: f['to']=to
    return E("KvSent",1,**f)
def landed(room,dst,c=0,epoch=0): return E("KvLanded",2,write=W(room,c,epoch=epoch),dst=dst)
def written(node,room,pages,start,tokens,pos=None):
    f=dict(room=room,pages=pages,start=start,tokens=tokens)
    if pos is not None: f['pos']=pos
    return E("KvWritten",node,**f)
def accepted(room=A,frm=1,prompt=6,res=2,st=6,sp=2,full=True): return E("TransferAccepted",2,room=room,**{"from":frm},prompt_len=prompt,reserved_pages=res,sent_tokens=st,sent_pages=sp,fully_written=full)
def attend(room,step,seq,pages,q=0): return E("Attend",2,room=room,step=step,query_pos=q,seq_len=seq,pages=pages)
def end(outcome="drained",detail=None): return X("end",outcome=outcome,detail=detail or outcome)
P1,P2=T(1),T(2); D1,D2=T(1),T(2)
def base(drop=(), outcome="drained", extra_end=()):
    """One request served cleanly, end to end (prompt 6 tokens, 2 new; page_size 4)."""
    ev=[("submit",X("submit",req=0,tenant=1,prompt_len=6,max_new_tokens=2)),
     ("routed",routed()),
     ("admit_p",E("Admitted",1,room=A,req=0,side="Prefill",prompt_len=6)),
     ("admit_d",E("Admitted",2,room=A,req=0,side="Decode",prompt_len=6)),
     ("res_d",reserve(2,A,[D1,D2])),
     ("expect",E("PagesExpectWrite",2,room=A,pages=[D1,D2])),
     ("res_p",reserve(1,A,[P1,P2])),
     ("run_p",E("Running",1,room=A,side="Prefill")),
     ("fwd",written(1,A,[P1,P2],0,6,pos=0)),
     ("ready_p",E("PagesReady",1,room=A,pages=[P1,P2])),
     ("held",E("PagesHeld",1,pages=[P1,P2])),
     ("sent",sent(A,[P1,P2],[D1,D2])),
     ("landed",landed(A,[D1,D2])),
     ("done",E("WriteCompleted",1,write=W(A),ok=True)),
     ("unheld",E("PagesUnheld",1,pages=[P1,P2],freed=[])),
     ("reported",E("TransferReported",2,room=A,**{"from":1},success=True)),
     ("accepted",accepted()),
     ("ready_d",E("PagesReady",2,room=A,pages=[D1,D2])),
     ("rel_p",release(1,A,[P1,P2])),
     ("resp_p",E("Responded",1,room=A,side="Prefill",status=200)),
     ("run_d",E("Running",2,room=A,side="Decode")),
     ("att0",attend(A,0,6,[D1,D2])),
     ("step0",written(2,A,[D2],2,1,pos=6)),
     ("att1",attend(A,1,7,[D1,D2],q=5)),
     ("step1",written(2,A,[D2],3,1,pos=7)),
     ("resp_d",E("Responded",2,room=A,side="Decode",status=200)),
     ("rel_d",release(2,A,[D1,D2])),
     ("answer",E("RouterResponse",0,req=0,room=A,status=200,tokens=[65536,65541])),
     ("response",X("response",req=0,status=200,tokens=[65536,65541])),
     ("cleared",E("RoomCleared",0,room=A)),
    ]
    out=[e for k,e in ev if k not in drop]
    out+=list(extra_end)
    if outcome: out.append(end(outcome, None if outcome=="drained" else "the run did not drain within 2 s of simulated time"))
    return out
cases=[]
def case(name, entries, header=None, findings=(), clause=None, near_miss=None, points=(), note="", files=None):
    cases.append(dict(name=name, entries=entries, header=header or hdr(), findings=list(findings), clause=clause, near_miss=near_miss, points=list(points), note=note, files=files))
def line(entries, pred):
    """the line number (1-based, header = 1) of the first entry matching pred"""
    for i,e in enumerate(entries):
        if pred(e): return i+2
    raise Exception("no such entry")
def last(entries): return len(entries)+1
def at(entries, ev): return line(entries, lambda e: e is ev)

# ---------- the clean run and liveness ----------
b=base(); case("clean-one-request", b, points=[1,4,6], note="one request served end to end: every judged record, no finding (KvWritten.start is an offset into the listed pages: the decode steps write slots 2 and 3 of their one page, meant for positions 6 and 7, its pos)", near_miss=["L1.bound","L1.unanswered","L1.open","L2.rooms","L4.pages","S3.attend"])
b=base(outcome="liveness_bound"); case("l1-bound", b, findings=[("VIOLATED","L1",last(b))], clause="L1.bound", points=[8], note="the same run ending at its liveness bound: L1 alone (L2-L4 are judged too and hold)")
b=base(drop=("cleared",), outcome="event_limit"); case("l1-bound-and-l2", b, findings=[("VIOLATED","L1",last(b)),("VIOLATED","L2",last(b))], clause="L2.rooms", points=[8], note="at event_limit L2-L4 are judged as at drained: the room never cleared is L2")
b=base(); b.insert(1, X("submit",req=1,tenant=1,prompt_len=3,max_new_tokens=1)); case("l1-unanswered", b, findings=[("VIOLATED","L1",last(b))], clause="L1.unanswered")
b=base(drop=("resp_d",)); case("l1-open-half", b, findings=[("VIOLATED","L1",last(b))], clause="L1.open", note="decode never answered its half")
b=base(drop=("cleared",)); case("l2-room-not-cleared", b, findings=[("VIOLATED","L2",last(b))], clause="L2.rooms")
b=base(extra_end=[E("Quarantined",2,room=B,pages=[])]); case("l3-quarantine-kept", b, findings=[("VIOLATED","L3",last(b))], clause="L3.quarantine", note="a quarantine (of no pages) never released by a node that did not stop")
b=base(extra_end=[E("Quarantined",2,room=B,pages=[]),E("Fault",2,fault={"fault":"DrainAckMissing","room":B,"retries":3})]); case("l3-stopped-node-near-miss", b, near_miss=["L3.quarantine"], note="the same quarantine on a node that stopped loudly (DrainAckMissing): no L3")
b=base(drop=("rel_d",)); case("l4-pages-kept", b, findings=[("VIOLATED","L4",last(b))], clause="L4.pages")
# a stopped node may keep Quarantined pages
b=base(drop=("rel_d",)); i=[x[1].get('event') for x in b].index('RouterResponse'); b.insert(i, E("Quarantined",2,room=A,pages=[D1,D2])); b.insert(i+1, E("Fault",2,fault={"fault":"DrainAckMissing","room":A,"retries":3}))
case("l4-stopped-node-near-miss", b, near_miss=["L4.pages"], note="decode quarantined the room's pages and stopped loudly: it may keep them (no L3, no L4)")
# several files
b=base()
case("several-files", b, points=[11], files=True, note="the clean run written as two files (router and prefill; decode), each with its header and its own end, merged by at_ns", near_miss=["S2.stray-read"])
# ---------- S1 ----------
e=[routed(), reserve(2,A,[D1]), routed(B,req=1), reserve(2,B,[T(1,2)])]
case("s1-reserve-busy", e, findings=[("VIOLATED","S1",last(e))], clause="S1.reserve-busy")
e=[routed(), reserve(2,A,[D1]), release(2,A,[D1]), routed(B,req=1), reserve(2,B,[T(1,2)])]
case("s1-reserve-near-miss", e, near_miss=["S1.reserve-busy","S1.reserve-gen"], note="the page was released first and its generation advances")
e=[routed(), reserve(2,A,[D1]), release(2,A,[D1]), routed(B,req=1), reserve(2,B,[T(1,1)])]
case("s1-reserve-gen", e, findings=[("VIOLATED","S1",last(e))], clause="S1.reserve-gen")
e=[routed(), reserve(2,A,[T(9)])]
case("s1-reserve-nonpage", e, findings=[("VIOLATED","S1",last(e))], clause="S1.reserve-nonpage", note="decode's pool has pages 1..=8")
e=[routed(), reserve(2,A,[T(8)])]
case("s1-reserve-nonpage-near-miss", e, near_miss=["S1.reserve-nonpage"])
e=[routed(), routed(B,req=1), reserve(2,A,[D1]), E("PagesExpectWrite",2,room=B,pages=[D1])]
case("s1-move-owner", e, findings=[("VIOLATED","S1",last(e))], clause="S1.move-owner")
e=[routed(), reserve(2,A,[D1]), E("PagesExpectWrite",2,room=A,pages=[T(1,2)])]
case("s1-move-gen", e, findings=[("VIOLATED","S1",last(e))], clause="S1.move-owner", note="the generation is not the page's")
e=[routed(), reserve(2,A,[D1]), E("PagesExpectWrite",2,room=A,pages=[D1]), E("PagesReady",2,room=A,pages=[D1]), E("Quarantined",2,room=A,pages=[D1])]
case("s1-move-near-miss", e, near_miss=["S1.move-owner","S1.move-state"], note="Reserved -> Writing -> Ready -> Quarantined, all allowed")
e=[routed(), reserve(2,A,[D1]), E("Quarantined",2,room=A,pages=[D1]), E("PagesReady",2,room=A,pages=[D1])]
case("s1-move-state", e, findings=[("VIOLATED","S1",last(e))], clause="S1.move-state", note="Quarantined -> Ready is not a move of the lifecycle")
e=[E("PagesHeld",1,pages=[P1])]
case("s1-hold-free-page", e, findings=[("VIOLATED","S1",last(e))], clause="S1.hold", note="a finding about no room")
e=[routed(), reserve(1,A,[P1]), E("PagesHeld",1,pages=[P1])]
case("s1-hold-near-miss", e, near_miss=["S1.hold"])
# ---------- S2 ----------
# A stray landing (a KvLanded into a page its write's room does not own) is no finding
# by itself: on a one-sided transport nothing could check it. It is judged by its effect.
stray=[routed(), reserve(2,A,[D1]), E("PagesExpectWrite",2,room=A,pages=[D1]), release(2,A,[D1]), landed(A,[D1])]
e=stray+[]
case("s2-stray-unread-near-miss", e, near_miss=["S2.stray-read"], note="A's write landed in its page after decode freed it (the send is not in the trace) and nothing reads the page: no finding (on a one-sided transport no receiver could have checked it)")
e=[routed(), reserve(2,A,[D1]), E("PagesExpectWrite",2,room=A,pages=[D1]), landed(A,[D1]), release(2,A,[D1])]
case("s2-land-near-miss", e, near_miss=["S2.stray-read"], note="a landing in a page its room owns is no stray landing")
e=[routed(), reserve(2,A,[D1]), E("Quarantined",2,room=A,pages=[D1]), landed(A,[D1])]
case("s2-land-quarantined-near-miss", e, near_miss=["S2.stray-read"], note="a quarantined page takes its room's writes")
reuse=[routed(B,req=1,prompt=4), reserve(2,B,[T(1,2)]), E("PagesExpectWrite",2,room=B,pages=[T(1,2)])]
e=stray+reuse+[attend(B,0,4,[T(1,2)])]
case("s2-stray-read", e, findings=[("VIOLATED","S2",last(e)),("VIOLATED","S3",last(e))], clause="S2.stray-read", note="B reads the page that holds A's stray bytes: S2 (the stray landing had its effect) and S3 (slots B never wrote)")
e=stray+reuse+[written(2,B,[T(1,2)],0,4), attend(B,0,4,[T(1,2)])]
case("s2-stray-overwritten-near-miss", e, near_miss=["S2.stray-read","S3.attend"], note="B's own KV overwrote the stray bytes before it read them: no finding")
e=stray+reuse+[E("TagMismatch",2,room=B,step=0,seq_len=4,pages=[T(1,2)],tag=T(1,2),current=1)]
case("s2-stray-tag", e, findings=[("DETECTED","S2",last(e)),("DETECTED","S3",last(e))], clause="S2.stray-tag", note="the read-time tag check (the stray write stamped its own, stale, tag) refused B's read of the stray bytes: detected by page_tags")
e=stray+reuse+[written(2,B,[T(1,2)],0,4), E("TagMismatch",2,room=B,step=0,seq_len=4,pages=[T(1,2)],tag=T(1,2),current=1)]
case("s2-stray-tag-near-miss", e, near_miss=["S2.stray-tag","S3.tag"], note="B's own KV overwrote the stray bytes before the tag check refused its read: no finding")
e=stray+reuse+[E("TransferRefused",2,room=B,**{"from":1},prompt_len=4,reserved_pages=1,sent_tokens=4,sent_pages=1,fully_written=True,reason="checksum over the reserved prompt differs")]
case("s2-stray-verify", e, findings=[("DETECTED","S2",last(e)),("DETECTED","S4",last(e))], clause="S2.stray-verify", note="verification refused B's transfer over the page holding the stray bytes: detected by verify_on_completion")
e=[routed(), reserve(2,A,[D1]), reserve(1,A,[P1]), written(1,A,[P1],0,4), sent(A,[P1],[D1]), release(2,A,[D1]), E("KvRefused",2,write=W(A),tag=D1,reason="owned by None")]
case("s2-refuse", e, findings=[("DETECTED","S2",last(e))], clause="S2.refuse", note="the landing gate (two-sided transports only) refused a write aimed at a page its room lost: detected by landing_gate")
e=[routed(), reserve(2,A,[D1]), reserve(1,A,[P1]), written(1,A,[P1],0,4), sent(A,[P1],[D1]), landed(A,[D1]), E("PagesReady",2,room=A,pages=[D1]), X("fault",fault="data_fault",**{"from":1},to=2,write=W(A),kind="stale_duplicate",meant=D1,landed=D1), E("KvRefused",2,write=W(A),tag=D1,reason="page is Ready")]
case("s2-refuse-stale-duplicate-ready", e, near_miss=["S2.refuse"], points=[13], note="a stale duplicate of the room's own write refused at a Ready page its room still owns: no finding")
e=[routed(), E("KvRefused",2,write=W(A),tag=None,reason="payload and page list differ in length")]
case("s2-refuse-null-tag", e, near_miss=["S2.refuse"], points=[12], note="a refusal with tag null of a write with no destination (its send is not in the trace): no finding")
e=[routed(), reserve(2,A,[D1]), reserve(1,A,[P1]), sent(A,[P1],[D1]), release(1,A,[P1])]
case("s2-free-read", e, findings=[("VIOLATED","S2",last(e))], clause="S2.free-read", note="prefill freed the source page of a write still in flight")
e=[routed(), reserve(2,A,[D1]), reserve(1,A,[P1]), sent(A,[P1],[D1]), landed(A,[D1]), release(1,A,[P1])]
case("s2-free-read-near-miss", e, near_miss=["S2.free-read"], points=[4], note="the write landed: no longer in flight (its completion is not needed)")
e=[routed(), reserve(2,A,[D1]), reserve(1,A,[P1]), E("PagesHeld",1,pages=[P1]), sent(A,[P1],[D1]), release(1,A,[P1],held=[P1])]
case("s2-free-held-near-miss", e, near_miss=["S2.free-read","S2.free-held"], note="the held page goes to Draining, not Free")
e=[routed(), reserve(2,A,[D1]), reserve(1,A,[P1]), E("PagesHeld",1,pages=[P1]), sent(A,[P1],[D1]), release(1,A,[P1],held=[P1]), E("PagesUnheld",1,pages=[P1],freed=[P1])]
case("s2-unheld-free-near-miss", e, near_miss=["S2.free-read"], note="a page that goes Free through PagesUnheld (its last holder left) is not judged by S2.free-read")
e=[routed(), reserve(1,A,[P1]), E("PagesHeld",1,pages=[P1]), release(1,A,[P1])]
case("s2-free-held", e, findings=[("VIOLATED","S2",last(e))], clause="S2.free-held", note="a checked release that does not list the held page")
e=[routed(), written(1,A,[P1],0,4)]
case("s2-written", e, findings=[("VIOLATED","S2",last(e))], clause="S2.written")
e=[routed(), reserve(1,A,[P1]), written(1,A,[P1],0,4)]
case("s2-written-near-miss", e, near_miss=["S2.written","S2.sent"])
e=[routed(), sent(A,[P1],[D1])]
case("s2-sent", e, findings=[("VIOLATED","S2",last(e))], clause="S2.sent")
# ---------- S3 ----------
e=[routed(prompt=4), reserve(2,A,[D1]), attend(A,0,4,[D1])]
case("s3-attend-unwritten", e, findings=[("VIOLATED","S3",last(e))], clause="S3.attend")
e=[routed(prompt=4), reserve(2,A,[D1]), written(2,A,[D1],0,3), attend(A,0,4,[D1])]
case("s3-attend-partly-written", e, findings=[("VIOLATED","S3",last(e))], clause="S3.attend", note="slots 0..3 only")
e=[routed(B,req=1,prompt=4), reserve(2,B,[D1]), written(2,B,[D1],0,4), release(2,B,[D1]), E("RoomCleared",0,room=B), routed(prompt=4), reserve(2,A,[T(1,2)]), attend(A,0,4,[T(1,2)])]
case("s3-attend-other-room", e, findings=[("VIOLATED","S3",last(e))], clause="S3.attend", note="the page holds the KV another room use wrote")
e=[routed(prompt=4), reserve(2,A,[D1]), written(2,A,[D1],0,4), E("PagesZeroed",2,pages=[1]), attend(A,0,4,[D1])]
case("s3-attend-zeroed", e, findings=[("VIOLATED","S3",last(e))], clause="S3.attend", points=[12], note="PagesZeroed lists page ids: the zeroed slots hold no one's KV")
e=[routed(prompt=4), reserve(2,A,[D1]), written(2,A,[D1],0,2), written(2,A,[D1],3,1), attend(A,0,4,[D1])]
case("s3-attend-gap", e, findings=[("VIOLATED","S3",last(e))], clause="S3.attend", note="slot 2 was never written: the write of slot 3 leaves a gap and restarts the page's range at 3..4")
e=[routed(prompt=4), reserve(2,A,[D1]), written(2,A,[D1],0,4), written(2,A,[D1],1,1), attend(A,0,4,[D1])]
case("s3-attend-rewrite-near-miss", e, near_miss=["S3.attend"], note="rewriting slot 1 keeps the range 0..4")
e=[routed(prompt=6), reserve(2,A,[D1,D2]), written(2,A,[D1,D2],0,6), written(2,A,[D2],2,2), attend(A,0,8,[D1,D2])]
case("s3-attend-offset-near-miss", e, near_miss=["S3.attend"], points=[1], note="the second KvWritten lists one page: start 2 is its slot, not sequence position 6")
e=[routed(prompt=8), reserve(2,A,[D1,D2]), reserve(1,A,[P1,P2]), written(1,A,[P1,P2],0,8,pos=0), sent(A,[P2],[D1]), landed(A,[D1]), sent(A,[P1],[D2],c=1), landed(A,[D2],c=1), attend(A,0,8,[D1,D2])]
case("s3-attend-position", e, findings=[("VIOLATED","S3",last(e))], clause="S3.attend", points=[14], note="the room's own KV at the wrong offset: its first decode page holds what prefill wrote for positions 4..8 (the write of its second page), read as positions 0..4 (KvWritten.pos)")
e=[routed(prompt=8), reserve(2,A,[D1,D2]), reserve(1,A,[P1,P2]), written(1,A,[P1,P2],0,8,pos=0), sent(A,[P1],[D1]), landed(A,[D1]), sent(A,[P2],[D2],c=1), landed(A,[D2],c=1), written(2,A,[D2],0,1,pos=4), attend(A,0,8,[D1,D2])]
case("s3-attend-position-near-miss", e, near_miss=["S3.attend"], note="each page lands where its positions are read; decode's rewrite of slot 0 of its second page is meant for position 4, where it is read")
e=[routed(prompt=8), reserve(2,A,[D1,D2]), reserve(1,A,[P1,P2]), written(1,A,[P1,P2],0,8), sent(A,[P2],[D1]), landed(A,[D1]), sent(A,[P1],[D2],c=1), landed(A,[D2],c=1), attend(A,0,8,[D1,D2])]
case("s3-attend-position-unstated-near-miss", e, near_miss=["S3.attend"], points=[14], note="the same swapped landing in a trace whose KvWritten states no pos (before it was added): S3 judges the owner only, which is right")
e=[routed(prompt=4), reserve(2,A,[D1]), reserve(1,A,[P1]), written(1,A,[P1],0,4), sent(A,[P1],[D1]), landed(A,[D1]), attend(A,0,4,[D1])]
case("s3-attend-landed-near-miss", e, near_miss=["S3.attend","S3.tag"], note="provenance travels with the write: the landed page holds what its source held when sent")
e=[routed(prompt=4), reserve(2,A,[D1]), E("TagMismatch",2,room=A,step=0,seq_len=4,pages=[D1],tag=D1,current=2)]
case("s3-tag", e, findings=[("DETECTED","S3",last(e))], clause="S3.tag", points=[12])
e=[routed(prompt=4), reserve(2,A,[D1]), written(2,A,[D1],0,4), E("TagMismatch",2,room=A,step=0,seq_len=4,pages=[D1],tag=D1,current=1)]
case("s3-tag-near-miss", e, near_miss=["S3.tag"], note="the refused read would have read only the room's own KV")
CAN=hdr(canary_tokens=True)
e=[routed(), E("RouterResponse",0,req=0,room=A,status=500,tokens=[(2<<16)|1])]
case("s3-canary", e, header=CAN, findings=[("VIOLATED","S3",last(e))], clause="S3.canary", points=[2], note="the token names request 1 (any status)")
e=[routed(), E("RouterResponse",0,req=0,room=A,status=500,tokens=[(1<<16)|1, 0, 5, 65535])]
case("s3-canary-near-miss", e, header=CAN, near_miss=["S3.canary"], points=[2], note="its own token and tokens under 2^16, which name no request")
# ---------- S4 ----------
e=[routed(), accepted(st=5)]
case("s4-tokens", e, findings=[("VIOLATED","S4",last(e))], clause="S4.tokens")
e=[routed(), accepted(prompt=1,res=1,st=1,sp=1)]
case("s4-tokens-placeholder", e, findings=[("VIOLATED","S4",last(e))], clause="S4.tokens", points=[7], note="both halves agree on the legacy 1-token placeholder; the routed prompt has 6")
e=[routed(), accepted(sp=1)]
case("s4-pages", e, findings=[("VIOLATED","S4",last(e))], clause="S4.pages")
e=[routed(), accepted(full=False)]
case("s4-unwritten", e, findings=[("VIOLATED","S4",last(e))], clause="S4.unwritten")
e=[routed(), accepted()]
case("s4-near-miss", e, near_miss=["S4.tokens","S4.pages","S4.unwritten","S7.peer"])
# Where the trace records decode's destination pages, "every reserved page written" is
# judged from the landings (KvLanded), not from decode's claim: on one-sided RDMA
# decode sees no landing and reads its pages' tags, which a later write can change.
e=[routed(), reserve(2,A,[D1,D2]), E("PagesExpectWrite",2,room=A,pages=[D1,D2]), landed(A,[D1]), accepted(full=True)]
case("s4-unlanded", e, findings=[("VIOLATED","S4",last(e))], clause="S4.unwritten", note="decode claims every page written; the landings show page 2 never was")
e=[routed(), reserve(2,A,[D1,D2]), E("PagesExpectWrite",2,room=A,pages=[D1,D2]), landed(A,[D1,D2]), accepted(full=False)]
case("s4-landed-near-miss", e, near_miss=["S4.unwritten"], note="decode's tags say a page is not its room's (a stale duplicate landed over it), but every page was written: not S4")
e=[routed(), E("TransferReported",2,room=A,**{"from":1},success=False), accepted(st=0,sp=0,full=False)]
case("s4-after-failed-report", e, near_miss=["S4.tokens"], points=[7], note="decode accepted after a failure report (fail-open): not S4")
e=[routed(), E("TransferRefused",2,room=A,**{"from":1},prompt_len=6,reserved_pages=2,sent_tokens=6,sent_pages=2,fully_written=True,reason="checksum over the reserved prompt differs")]
case("s4-refused-checksum", e, findings=[("DETECTED","S4",last(e))], clause="S4.refused", points=[7], note="counts agree, the content digest does not: S4 detected")
e=[routed(), E("TransferFailed",2,room=A,reason="prefill reported the transfer failed")]
case("s4-failed-near-miss", e, near_miss=["S4.refused"])
# ---------- S5 / L5 ----------
e=[routed(prompt=70), E("Admitted",1,room=A,req=0,side="Prefill",prompt_len=70)]
case("s5-admitted", e, findings=[("VIOLATED","S5",last(e))], clause="S5.admitted", points=[3], note="prefill's limit is min(64, 16*4) = 64")
e=[routed(prompt=60,maxn=10), reserve(2,A,[D1,D2])]
case("s5-reserved-decode", e, findings=[("VIOLATED","S5",last(e))], clause="S5.reserved", points=[3], note="decode holds prompt + max_new_tokens = 70 > 64")
e=[routed(prompt=70), sent(A,[],[])]
case("s5-sent", e, findings=[("VIOLATED","S5",last(e))], clause="S5.sent")
e=[routed(prompt=70), E("Running",1,room=A,side="Prefill")]
case("s5-running", e, findings=[("VIOLATED","S5",last(e))], clause="S5.running")
e=[routed(prompt=28,maxn=10), E("RejectedLegacy",2,room=A,prompt_len=28), E("Admitted",2,room=A,req=0,side="Decode",prompt_len=1)]
case("s5-flagged", e, findings=[("VIOLATED","S5",last(e))], clause="S5.admitted", note="within the context, but decode flagged it with a legacy rejection and admitted it anyway")
e=[routed(prompt=60,maxn=4), E("Admitted",1,room=A,req=0,side="Prefill",prompt_len=60), E("Rejected",2,room=A,side="Decode",status=400,reason="over the limit")]
case("s5-near-miss", e, near_miss=["S5.admitted"], points=[3], note="prefill holds 60 <= 64; decode rejected 64 > 32")
e=[routed(prompt=70), E("Truncated",1,room=A,**{"from":70},to=64), E("Admitted",1,room=A,req=0,side="Prefill",prompt_len=64), E("Running",1,room=A,side="Prefill")]
case("s5-truncated-near-miss", e, header=hdr(allow_auto_truncate=True), near_miss=["S5.admitted","S5.running"], points=[3], note="under allow_auto_truncate prefill serves the prompt cut to its limit")
e=[routed(prompt=28,maxn=10), E("Admitted",2,room=A,req=0,side="Decode",prompt_len=28)]
case("l5-admitted", e, findings=[("VIOLATED","L5",last(e))], clause="L5.admitted", points=[3], note="38 > decode's 32, within the context of 64: admitted beyond the pool")
e=[routed(prompt=54,maxn=10), E("Admitted",2,room=A,req=0,side="Decode",prompt_len=54)]
case("l5-at-context", e, findings=[("VIOLATED","L5",last(e))], clause="L5.admitted", points=[3], note="decode needs 64 = context_len, over its pool of 32: within the context, so L5")
e=[routed(prompt=64,maxn=0), E("Admitted",1,room=A,req=0,side="Prefill",prompt_len=64)]
case("s5-at-limit-near-miss", e, near_miss=["S5.admitted"], points=[3], note="a prompt of exactly prefill's limit (64) is admitted")
e=[routed(prompt=28,maxn=10), reserve(2,A,[D1])]
case("l5-reserved", e, findings=[("VIOLATED","L5",last(e))], clause="L5.reserved")
e=[routed(prompt=28,maxn=10), E("Running",2,room=A,side="Decode")]
case("l5-running", e, findings=[("VIOLATED","L5",last(e))], clause="L5.running")
e=[routed(prompt=40), sent(A,[],[])]
case("l5-sent", e, header=hdr(pools=[8,8]), findings=[("VIOLATED","L5",last(e))], clause="L5.sent", note="prefill's pool holds 32 tokens")
e=[routed(prompt=28,maxn=4), E("Admitted",2,room=A,req=0,side="Decode",prompt_len=28), reserve(2,A,[T(i) for i in range(1,9)]), E("Running",2,room=A,side="Decode")]
case("l5-near-miss", e, near_miss=["L5.admitted","L5.reserved","L5.running","L5.pool","S5.reserved","S5.running"], note="32 <= 32; eight pages of eight")
e=[routed(prompt=32), sent(A,[],[])]
case("l5-sent-near-miss", e, header=hdr(pools=[8,8]), near_miss=["L5.sent","S5.sent"], note="32 <= prefill's 32")
e=[routed(prompt=4,maxn=1), reserve(2,A,[T(i) for i in range(1,9)]+[T(1,2)])]
case("l5-pool", e, findings=[("VIOLATED","L5",last(e))], clause="L5.pool", note="nine tags on a pool of eight pages")
# ---------- S6 ----------
e=[routed(), E("RouterResponse",0,req=0,room=A,status=500,tokens=[]), E("RouterResponse",0,req=0,room=A,status=500,tokens=[])]
case("s6-twice", e, findings=[("VIOLATED","S6",last(e))], clause="S6.twice")
e=[routed(), E("RouterResponse",0,req=0,room=A,status=500,tokens=[])]
case("s6-once-near-miss", e, near_miss=["S6.twice"])
e=[routed(prompt=70), E("RouterResponse",0,req=0,room=A,status=200,tokens=[1,2])]
case("s6-over-limit", e, findings=[("VIOLATED","S6",last(e))], clause="S6.over-limit")
e=[routed(prompt=70), E("RouterResponse",0,req=0,room=A,status=400,tokens=[])]
case("s6-over-limit-near-miss", e, near_miss=["S6.over-limit"])
e=[routed(), E("AbortNoted",1,room=A,side="Prefill"), E("Responded",1,room=A,side="Prefill",status=200)]
case("s6-prefill-abort", e, findings=[("VIOLATED","S6",last(e))], clause="S6.prefill-abort")
e=[routed(), E("AbortNoted",2,room=A,side="Decode"), E("Responded",1,room=A,side="Prefill",status=200), E("AbortNoted",1,room=A,side="Prefill"), E("Responded",1,room=A,side="Prefill",status=200)]
case("s6-abort-near-miss", e, near_miss=["S6.prefill-abort","S6.repeat"], note="prefill answered 200 before it saw the abort; seeing the abort it repeats its first answer (200), which is honest")
e=[routed(), E("Responded",1,room=A,side="Prefill",status=200), E("AbortNoted",1,room=A,side="Prefill"), E("Responded",1,room=A,side="Prefill",status=499)]
case("s6-repeat", e, findings=[("VIOLATED","S6",last(e))], clause="S6.repeat", note="a half answers once: a repeat (an abort seen again after a lost answer) must carry the first status")
e=[routed(), E("Responded",2,room=A,side="Decode",status=500), X("fault",fault="crash",node=2,epoch=0,flushed=[]), X("fault",fault="restart",node=2,epoch=1), E("Responded",2,room=A,side="Decode",status=499)]
case("s6-repeat-near-miss", e, near_miss=["S6.repeat"], note="the second answer comes from a restarted incarnation, which remembers no answer of the dead one")
e=[routed(), E("TransferReported",2,room=A,**{"from":1},success=False), E("Responded",2,room=A,side="Decode",status=200)]
case("s6-decode-failed", e, findings=[("VIOLATED","S6",last(e))], clause="S6.decode-failed")
e=[routed(), E("TransferReported",2,room=A,**{"from":1},success=False), E("Responded",2,room=A,side="Decode",status=500)]
case("s6-decode-failed-near-miss", e, near_miss=["S6.decode-failed"])
# ---------- S7 ----------
e=[routed(), accepted(frm=4)]
case("s7-peer", e, findings=[("VIOLATED","S7",last(e))], clause="S7.peer")
e=[routed(), routed()]
case("s7-routed-twice", e, findings=[("VIOLATED","S7",last(e))], clause="S7.routed-twice", note="the router routes room1.g1 again while its first attempt is open: a replay in the same room use")
e=[routed(), E("RoomCleared",0,room=A), routed()]
case("s7-routed-twice-after-clear", e, findings=[("VIOLATED","S7",last(e))], note="the same room use routed again after it was cleared: still two attempts in one room use")
e=[routed(), E("RoomCleared",0,room=A), routed(R(1,2))]
case("s7-routed-twice-near-miss", e, near_miss=["S7.routed-twice"], note="room number 1 routed again at a newer generation: a new room use")
# ---------- S8 ----------
e=[routed(), routed(B,req=1), reserve(2,A,[D1]), release(2,B,[D1])]
case("s8-not-owned", e, findings=[("VIOLATED","S8",last(e))], clause="S8.not-owned")
e=[routed(), release(2,A,[T(9)])]
case("s8-nonpage-release-near-miss", e, near_miss=["S8.not-owned"], note="a release of a page id outside the pool is ignored")
e=[routed(), reserve(2,A,[D1]), release(2,A,[D1]), release(2,A,[D1])]
case("s8-twice", e, findings=[("VIOLATED","S8",last(e))], clause="S8.twice")
e=[routed(), reserve(2,A,[D1]), release(2,A,[D1])]
case("s8-near-miss", e, near_miss=["S8.not-owned","S8.twice"])
e=[routed(), reserve(2,A,[D1]), E("QuarantineReleased",2,room=A,pages=[D1],acked=A,held=[])]
case("s8-quarantine-not-quarantined", e, findings=[("VIOLATED","S8",last(e))], clause="S8.not-owned", note="QuarantineReleased of a page that is Reserved")
e=[routed(), reserve(2,A,[D1]), E("Quarantined",2,room=A,pages=[D1]), E("QuarantineReleased",2,room=A,pages=[D1],acked=A,held=[])]
case("s8-quarantine-near-miss", e, near_miss=["S8.not-owned","S9.other-ack","S9.release-in-flight"])
e=[routed(), routed(B,req=1), reserve(2,A,[D1]), release(2,B,[D1],how="Unchecked"), reserve(2,B,[T(1,2)]), written(2,A,[D1],0,1)]
case("s8-wrongful-free", e, findings=[("VIOLATED","S8",at(e,e[3])),("VIOLATED","S2",last(e))], clause="S8.not-owned", points=[9], note="an unchecked free of another room's page is S8 and frees it; its reuse is no S1; the victim's write into it is S2")
# ---------- S9 ----------
e=[routed(), reserve(1,A,[P1]), sent(A,[P1],[D1]), E("DrainAcked",1,room=A)]
case("s9-ack-in-flight", e, findings=[("VIOLATED","S9",last(e))], clause="S9.ack-in-flight")
e=[routed(), reserve(1,A,[P1]), sent(A,[P1],[D1]), X("write_failed",**{"from":1},to=2,write=W(A),reason="injected"), E("DrainAcked",1,room=A)]
case("s9-ack-near-miss", e, near_miss=["S9.ack-in-flight"], points=[4], note="the write failed on the wire: no longer in flight")
e=[routed(), E("Admitted",1,room=A,req=0,side="Prefill",prompt_len=6), E("DrainAcked",1,room=A), reserve(1,A,[P1]), sent(A,[P1],[D1])]
case("s9-send-after-ack", e, findings=[("VIOLATED","S9",last(e))], clause="S9.send-after-ack")
e=[routed(), E("Admitted",1,room=A,req=0,side="Prefill",prompt_len=6), E("DrainAcked",1,room=A), E("Responded",1,room=A,side="Prefill",status=499), reserve(1,A,[P1]), sent(A,[P1],[D1])]
case("s9-send-after-ack-near-miss", e, near_miss=["S9.send-after-ack"], note="prefill's half was answered before the send: the drain ack is forgotten")
e=[routed(), routed(B,req=1), reserve(2,A,[D1]), E("Quarantined",2,room=A,pages=[D1]), E("QuarantineReleased",2,room=A,pages=[D1],acked=B,held=[])]
case("s9-other-ack", e, findings=[("VIOLATED","S9",last(e))], clause="S9.other-ack")
e=[routed(), reserve(2,A,[D1]), reserve(1,A,[P1]), sent(A,[P1],[D1]), E("Quarantined",2,room=A,pages=[D1]), E("QuarantineReleased",2,room=A,pages=[D1],acked=A,held=[])]
case("s9-release-in-flight", e, findings=[("VIOLATED","S9",last(e))], clause="S9.release-in-flight")
e=[routed(), reserve(2,A,[D1]), reserve(1,A,[P1]), sent(A,[P1],[D1]), E("Quarantined",2,room=A,pages=[D1]), landed(A,[D1]), E("QuarantineReleased",2,room=A,pages=[D1],acked=A,held=[])]
case("s9-release-near-miss", e, near_miss=["S9.release-in-flight"])
def reuse(to=2, withrouted=True, fail=False):
    e=[routed()] if withrouted else []
    e+=[reserve(2,A,[D1]), reserve(1,A,[P1]), sent(A,[P1],[D1],to=to), release(2,A,[D1])]
    if fail: e.append(X("write_failed",**{"from":1},to=2,write=W(A),reason="injected"))
    e+=[reserve(2,B,[T(1,2)])]
    return e
e=reuse(); case("s9-reuse-aimed", e, findings=[("VIOLATED","S9",last(e))], clause="S9.reuse-aimed", points=[6])
e=reuse(fail=True); case("s9-reuse-near-miss", e, near_miss=["S9.reuse-aimed"])
e=reuse(withrouted=False); case("s9-reuse-aimed-no-routed", e, findings=[("VIOLATED","S9",last(e))], clause="S9.reuse-aimed", points=[6], note="the trace starts after the Routed: KvSent.to alone says where the write goes")
e=reuse(to=None); case("v1-reuse-aimed", e, header=hdr(schema_version=1), findings=[("VIOLATED","S9",last(e))], clause="S9.reuse-aimed", points=[6,12], note="a version 1 trace: KvSent has no `to`; the receiver is the room's Routed.decode")
e=[routed(), reserve(2,A,[D1]), reserve(1,A,[P1]), sent(A,[P1],[D1]), X("fault",fault="crash",node=2,epoch=0,flushed=[]), X("fault",fault="restart",node=2,epoch=1),
   reserve(2,A,[T(1,(1<<32)+1)]), E("Quarantined",2,room=A,pages=[T(1,(1<<32)+1)]), E("QuarantineReleased",2,room=A,pages=[T(1,(1<<32)+1)],acked=A,held=[]), X("write_failed",**{"from":1},to=2,write=W(A),reason="stale_registration")]
case("s9-stale-registration-near-miss", e, near_miss=["S9.reuse-aimed","S9.release-in-flight"], points=[5], note="a write of the room addressed to decode's dead incarnation is aimed at nothing: the new incarnation may hand the page out again and release the room's quarantine under it (no S9)")
# ---------- S10 ----------
EH=hdr(canary_tokens=True, echo_replies=True)
e=[routed(prompt=4,maxn=2), E("RouterResponse",0,req=0,room=A,status=200,tokens=[(1<<16)|0])]
case("s10-count", e, header=EH, findings=[("VIOLATED","S10",last(e))], clause="S10.count")
e=[routed(prompt=4,maxn=2), E("RouterResponse",0,req=0,room=A,status=200,tokens=[(1<<16)|0,(1<<16)|2])]
case("s10-token", e, header=EH, findings=[("VIOLATED","S10",last(e))], clause="S10.token", note="step 1 of 2 echoes position 3")
e=[routed(prompt=4,maxn=2), E("RouterResponse",0,req=0,room=A,status=200,tokens=[(1<<16)|0,(1<<16)|3])]
case("s10-near-miss", e, header=EH, near_miss=["S10.count","S10.token"])
e=[routed(prompt=70000,maxn=2), E("RouterResponse",0,req=0,room=A,status=200,tokens=[(1<<16)|0,(1<<16)|(69999 & 0xFFFF)])]
case("s10-wrap-near-miss", e, header=hdr(canary_tokens=True, echo_replies=True, context_len=100000, pools=[20000,20000]), near_miss=["S10.token"], points=[2], note="position 69,999 of a 70,000-token prompt: its canary wraps at 2^16")
# ---------- L6 ----------
LH=hdr(cleanup_bound_ns=1000)
e=[routed(), E("Admitted",2,room=A,req=0,side="Decode",prompt_len=6), E("RouterResponse",0,req=0,room=A,status=500,tokens=[]), X("timer_fire",node=0,timer="Compute"), X("timer_fire",node=0,timer="Compute")]
case("l6-half-open", e, header=LH, findings=[("VIOLATED","L6",last(e))], clause="L6.cleanup", note="at_ns is 1000 per line: the first entry past the answer plus 1000 ns is two lines later")
e=[routed(), E("Admitted",2,room=A,req=0,side="Decode",prompt_len=6), E("RouterResponse",0,req=0,room=A,status=500,tokens=[]), E("Responded",2,room=A,side="Decode",status=500), X("timer_fire",node=0,timer="Compute")]
case("l6-near-miss", e, header=LH, near_miss=["L6.cleanup"])
e=[routed(), reserve(2,A,[D1]), E("RouterResponse",0,req=0,room=A,status=500,tokens=[]), X("timer_fire",node=0,timer="Compute"), X("timer_fire",node=0,timer="Compute")]
case("l6-pages-kept", e, header=LH, findings=[("VIOLATED","L6",last(e))], clause="L6.cleanup")
e=[routed(), reserve(2,A,[D1]), E("RouterResponse",0,req=0,room=A,status=500,tokens=[]), E("Quarantined",2,room=A,pages=[D1]), X("timer_fire",node=0,timer="Compute"), X("timer_fire",node=0,timer="Compute")]
case("l6-quarantined-near-miss", e, header=LH, near_miss=["L6.cleanup"], note="quarantined pages are let go")
# ---------- misdirect (point 10) ----------
e=[routed(), routed(B,req=1), reserve(2,A,[D1]), reserve(2,B,[D2]), reserve(1,A,[P1]), written(1,A,[P1],0,4), sent(A,[P1],[D1]), X("fault",fault="data_fault",**{"from":1},to=2,write=W(A),kind="misdirect",meant=D1,landed=D2), landed(A,[D1])]
case("misdirect-judged-by-address", e, near_miss=["S2.stray-read"], points=[10], note="a misdirected landing is judged by the tag it was addressed to (owned by its room): no finding, though it hit room B's page")
# ---------- unusable ----------
un=[]
def unusable(name, lines, line, field, points=(), note=""):
    un.append(dict(name=name, lines=lines, line=line, field=field, points=list(points), note=note))
def enc(h, entries, seq0=2):
    out=[json.dumps(h,separators=(',',':'))]
    for i,(t,f) in enumerate(entries):
        d={"at_ns":(i+seq0)*1000,"seq":i+seq0,"type":t}; d.update(f)
        out.append(json.dumps(d,separators=(',',':')))
    return out
l=enc(hdr(), [routed(), E("Admitted",1,room=A,req=0,side="Prefill",prompt_len=6)])
l[2]=l[2].replace('"room":','"rooom":')
unusable("unusable-misspelt-field", l, 3, "room", note="a misspelt required field is a missing one")
l=enc(hdr(schema_version=3), [routed()])
unusable("unusable-version-3", l, 1, "schema_version", points=[12])
h=hdr(); del h['nodes'][2]['pool_pages']
l=enc(h, [routed()])
unusable("unusable-no-pool-pages", l, 1, "nodes[2].pool_pages", points=[12])
l=enc(hdr(), [routed(), X("fault",fault="crash",epoch=0)])
unusable("unusable-crash-without-node", l, 3, "node", points=[12])

# ---------- write ----------
for f in os.listdir(OUT):
    if f.endswith('.jsonl'): os.remove(os.path.join(OUT,f))
toml=['# The conformance suite of the trace schema (docs/TRACE.md): every trace here with the',
 '# verdict `kvsim audit` gives it. See README.md. In every trace `seq` is the line number',
 '# (the header is line 1) and `at_ns` is 1000 times it, so a finding\'s `seq` is its line.',
 '#',
 '# findings: every finding, in the order found: "VIOLATED S1 at 5" (a violation) or',
 '#   "DETECTED S4 at 3" (a defense refused it); [] is clean.',
 '# clause: the clause of docs/TRACE.md ("The invariants, clause by clause", "Liveness")',
 '#   that this trace alone flags; near_miss: the clauses this trace comes close to',
 '#   and must not flag.',
 '# unusable: the trace cannot be used; `line` is the line refused, `field` the field named.',
 '# points: the points of issue 25 (docs/TRACE.md, "Decisions") the case settles.',
 '']
def q(s): return json.dumps(s)
for c in cases:
    files=[]
    if c['files']:
        b=c['entries']
        lines=enc(c['header'], b)
        body=[json.loads(x) for x in lines[1:]]
        hd=lines[0]
        f1=[hd]+[json.dumps(x,separators=(',',':')) for x in body if not (x['type']=='engine' and x['node']==2) and x['type']!='end']
        f2=[hd]+[json.dumps(x,separators=(',',':')) for x in body if (x['type']=='engine' and x['node']==2)]
        endl=[x for x in body if x['type']=='end'][0]
        f1.append(json.dumps(endl,separators=(',',':')))
        e2=dict(endl); e2['at_ns']-=500
        f2.append(json.dumps(e2,separators=(',',':')))
        f2.append(json.dumps({"at_ns":e2['at_ns'],"seq":e2['seq'],"type":"violation","violation":{"invariant":"S3","detail":"a finding of the writer's own oracle, after its end: ignored"},"detected_by":None,"room":A},separators=(',',':')))
        for k,fl in (("router-prefill",f1),("decode",f2)):
            fn=f"{c['name']}.{k}.jsonl"; open(os.path.join(OUT,fn),'w').write("\n".join(fl)+"\n"); files.append(fn)
    else:
        fn=c['name']+'.jsonl'
        open(os.path.join(OUT,fn),'w').write("\n".join(enc(c['header'],c['entries']))+"\n"); files=[fn]
    toml.append('[[case]]')
    toml.append('files = ['+', '.join(q(f) for f in files)+']')
    toml.append('findings = ['+', '.join(q(f"{v} {i} at {l}") for v,i,l in c['findings'])+']')
    if c['clause']: toml.append('clause = '+q(c['clause']))
    if c['near_miss']: toml.append('near_miss = ['+', '.join(q(x) for x in c['near_miss'])+']')
    if c['points']: toml.append('points = '+json.dumps(c['points']))
    if c['note']: toml.append('note = '+q(c['note']))
    toml.append('')
for u in un:
    fn=u['name']+'.jsonl'; open(os.path.join(OUT,fn),'w').write("\n".join(u['lines'])+"\n")
    toml.append('[[case]]'); toml.append('files = ['+q(fn)+']')
    toml.append('unusable = { line = %d, field = %s }'%(u['line'],q(u['field'])))
    if u['points']: toml.append('points = '+json.dumps(u['points']))
    if u['note']: toml.append('note = '+q(u['note']))
    toml.append('')
open(os.path.join(OUT,'expected.toml'),'w').write("\n".join(toml))
print(len(cases),"cases,",len(un),"unusable")
