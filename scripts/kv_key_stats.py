#!/usr/bin/env python3
"""Per-layer key statistics and the attention error of KV key formats, from recorded rows.

    python scripts/kv_key_stats.py DIR N_HEAD N_HEAD_KV HEAD_DIM N_LAYER [N_TOKENS]

DIR holds k_<layer>.bin and q_<layer>.bin: fp32 rows as attention sees them (post-RoPE keys
[T, n_head_kv * d], queries [T, n_head * d]) for one window of T tokens. For every layer it prints
the largest |K|, the median per-channel max, the three largest channels, the top channel's mean and
std over tokens, and for each simulated format the mean KL(p || p_q) of the softmax over keys for
48 queries in the second half and every query head, with keys 0..15 (the FP16 sink block) and the
last 128 (the FP16 window) exact, as BIE routes them. Formats are simulated in numpy with fp16
metadata (docs/kv-quality.md "Why the old int4_asym collapsed on Qwen2.5").
"""
import numpy as np, sys, os, json
D=sys.argv[1]; n_head=int(sys.argv[2]); H=int(sys.argv[3]); d=int(sys.argv[4]); L=int(sys.argv[5])
T=int(sys.argv[6]) if len(sys.argv)>6 else 2048
def had(n):
    h=np.array([[1.0]])
    while h.shape[0]<n: h=np.block([[h,h],[h,-h]])
    return h/np.sqrt(n)
R=had(d)
f16=lambda x: x.astype(np.float16).astype(np.float32)
def q_tok_group(x,G):  # x [t,d] per token groups along d, min/max 4-bit, fp16 scale/zero
    t=x.shape[0]; g=x.reshape(t,d//G,G); mn=g.min(-1,keepdims=True); mx=g.max(-1,keepdims=True)
    s=f16((mx-mn)/15); z=f16(mn); inv=np.where(s>0,1/np.where(s>0,s,1),0)
    n=np.clip(np.rint((g-z)*inv),0,15); return (s*n+z).reshape(t,d)
def q_chan(x,Tt):  # per channel over tiles of Tt tokens
    t=x.shape[0]; out=x.copy()
    for a in range(0,t-t%Tt,Tt):
        g=x[a:a+Tt]; mn=g.min(0); mx=g.max(0); s=f16((mx-mn)/15); z=f16(mn)
        inv=np.where(s>0,1/np.where(s>0,s,1),0); n=np.clip(np.rint((g-z)*inv),0,15); out[a:a+Tt]=s*n+z
    return out
def q_int8_tok(x,G):
    t=x.shape[0]; g=x.reshape(t,d//G,G); am=np.abs(g).max(-1,keepdims=True); s=f16(am/127)
    inv=np.where(s>0,1/np.where(s>0,s,1),0); n=np.clip(np.rint(g*inv),-127,127); return (s*n).reshape(t,d)
formats={
 'int4_g64':lambda k:q_tok_group(k,64),
 'int4_g64_rot':lambda k:q_tok_group(k@R.T,64)@R,
 'int4_g32_rot':lambda k:q_tok_group(k@R.T,32)@R,
 'chan_t16':lambda k:q_chan(k,16),
 'chan_t32':lambda k:q_chan(k,32),
 'chan_t64':lambda k:q_chan(k,64),
 'chan_t64_rot':lambda k:q_chan(k@R.T,64)@R,
 'int8_tok':lambda k:q_int8_tok(k,d),
 'int8_g32':lambda k:q_int8_tok(k,32),
 'int8_tok_rot':lambda k:q_int8_tok(k@R.T,d)@R,
}
rng=np.random.default_rng(0)
qpos=np.sort(rng.choice(np.arange(T//2,T),48,replace=False))
res={f:[] for f in formats}
for il in range(L):
    K=np.fromfile(f"{D}/k_{il}.bin",dtype=np.float32)[:T*H*d].reshape(T,H,d)
    Q=np.fromfile(f"{D}/q_{il}.bin",dtype=np.float32)[:T*n_head*d].reshape(T,n_head,d)
    cm=np.abs(K).max(0)  # [H,d]
    med=np.median(cm,axis=1); top=np.sort(cm,axis=1)[:,-3:]
    rms=np.sqrt((K**2).mean(0))
    line=f"L{il:2d} |K|max {np.abs(K).max():8.1f} medchanmax {med.round(2)} top3 {top.round(1).tolist()} "
    # std across tokens vs mean: outlier channels constant (bias)?
    chan=np.argmax(cm,axis=1)
    line+=f"outch {chan.tolist()} mean/std {[ (K[:,h,chan[h]].mean().round(1), K[:,h,chan[h]].std().round(2)) for h in range(H)]}"
    kl_line=[]
    for f,fn in formats.items():
        kls=[]
        for h in range(H):
            k=K[:,h,:]; kq=k.copy(); body=slice(16,T)
            kq[body]=fn(k[body])
            for qh in range(h*(n_head//H),(h+1)*(n_head//H)):
                for i in qpos:
                    q=Q[i,qh]; s=k[:i+1]@q/np.sqrt(d); sq=s.copy()
                    lo=16; hi=max(16,i+1-128)
                    sq[lo:hi]=kq[lo:hi]@q/np.sqrt(d)
                    p=np.exp(s-s.max()); p/=p.sum(); lp=np.log(p+1e-30)
                    pq=np.exp(sq-sq.max()); pq/=pq.sum()
                    kls.append(float((p*(lp-np.log(pq+1e-30))).sum()))
        res[f].append(np.mean(kls)); kl_line.append(f"{f}={np.mean(kls):.4f}")
    print(line); print("   attnKL", " ".join(kl_line), flush=True)
print("MEAN over layers:", {f:round(float(np.mean(v)),5) for f,v in res.items()})
print("MAX over layers:", {f:round(float(np.max(v)),5) for f,v in res.items()})
