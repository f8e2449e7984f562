// CUDA variants of the decode step's GPU tasks (decode.h): a span of layers' dense work with their
// cached experts (STRATA_LAYER_SPAN), and the output head, each one CUDA graph captured once and replayed
// (st_cuda_graph_replay) over the engine's persistent device buffers, the token's position and the
// step number read from device memory. A layer the CPU pool has pairs of hands its routing and FFN
// input to the CPU pool through the mailbox (dk_gateup's block 0) and the next layer's dk_pre
// takes the pool's rows from it (codelets/decode.h).
//
// A layer is eight kernels: dk_pre (the previous layer's combine and the attention norm), dk_mv
// (Q, K and V in one launch when their types agree), rope_append (with up to 128 keys also the
// attention itself) and attend_decode_all (the longer contexts; a span's graph is captured per
// attention regime, st_cuda_attend_regime, so a short context's graph has seven kernels)
// (attention.cu), dk_mv (the output projection), dk_router (residual, FFN norm, router logits),
// dk_gateup (each block the top-k for itself, block 0 also the weights, the layer's routing table and
// the mailbox; then gate, up and SwiGLU of every cached routed expert) and dk_down (down, weighted; it
// selects the experts itself too, so that its rows' copies start before it waits for dk_gateup), in
// decode_kernels.cuh. The mat-vec products share mmv.cuh's block core with
// st_cuda_matmul and st_cuda_grouped_matmul, and every other step repeats the float operations of
// the per-task kernels (rmsnorm_kernel, combine_token, residual_piece, swiglu, softmax_topk), so a
// decode step gives the same bits as the per-task path (STRATA_DECODE_GRAPH=0).
// Another architecture's layer (st_decode_ctx.dlayers: gpt-oss) adds its biases, sinks, sliding
// window, router bias and gating, expert biases and activation to the same kernels; a layer with a
// fixed FFN (a dense layer's, a shared expert) runs it after the experts (fixed_body), and dk_pre adds
// its row after the routed ones. An MLA layer (deepseek2) replaces Q/K/V, rope_append and the
// attention by mla_body's kernels (mla.cuh), the rest of the layer as above.
#include <vector>

#include "codelets/cuda/common.cuh"
#include "codelets/cuda/cuda_codelets.h"
#include "codelets/cuda/decode_kernels.cuh"
#include "codelets/cuda/mla.cuh"
#include "codelets/cuda/mmv.cuh"
#include "codelets/decode.h"
#include "common.h"
#include "io/model.h" // the gating and activation kinds

namespace {

// ---- launchers ---------------------------------------------------------------------------------

// Variant knobs (scripts/build-decode-variants): at most this many blocks an SM for dk_gateup and
// dk_down (0: as many as fit). With dk_gateup below the most, dk_down's first blocks find room at
// once and select and fetch while gate/up streams (its blocks otherwise start only as dk_gateup's
// leave: bench/RESULTS.md 2026-12-06, twenty-ninth session). dk_gateup at 3 an SM made an 8-layer
// qwen3 cut's step 1.2 % slower on an H100 (thirtieth session), so the default stays 0.
#ifndef DK_GATEUP_PER_SM
#define DK_GATEUP_PER_SM 0
#endif
#ifndef DK_DOWN_PER_SM
#define DK_DOWN_PER_SM 0
#endif

// The knockout build's mask (scripts/build-decode-variants -DDK_KNOCKOUT: STRATA_KNOCKOUT, its bits
// there), read once; 0 in every other build. Timing only: a part left out leaves wrong outputs.
int knockout() {
#ifdef DK_KNOCKOUT
  static const int m = getenv("STRATA_KNOCKOUT") ? atoi(getenv("STRATA_KNOCKOUT")) : 0;
  return m;
#else
  return 0;
#endif
}

struct mv_part {
  uint32_t type;
  const void *W;
  uint64_t row_bytes;
  int64_t rows;
  float *out;
  int q8; // the product takes the input row quantised (dense_q8)
};

// Whether the int8 kernels take a product of Q8_0 weights (STRATA_INT8_DOT), or of MXFP4 ones (also
// STRATA_MXFP4_INT8, on by default: mmv_chunk_rows_q8_mxfp4, checked against the CPU on an H200), with n-float rows.
bool q8_on(const st_decode_ctx *c, uint32_t type, int64_t n) {
  return c->int8_dot && (type == ST_TYPE_Q8_0 || (type == ST_TYPE_MXFP4 && c->mxfp4_int8)) && n % 32 == 0;
}

// The dense products dense_q8 may put on int8 activations (DK_DENSE_Q8's bits).
enum { DQ8_Q = 1, DQ8_HEAD = 2, DQ8_O = 4 };
// Whether dense product `part` (DQ8_*) of `type` weights on rows of n takes its input quantised on the
// decode step: Q8_0's Q, output projection and output head (STRATA_INT8_DOT), one int8 term as
// st_dense_terms takes them on the CPU (ST_DENSE_QO, ST_DENSE_HEAD). Q's and the head's input dk_pre
// quantises, the output projection's the attention's blocks, each the heads it wrote (st_dev_q8_span:
// no launch of its own). K and V keep float32 (the CPU's two terms: their rounding stays in the KV
// cache). The per-task path takes the same rule (attention.cu, linear.cu: st_cuda_matmul's int8 path
// for a one-token product).
// Variant knob for A/B builds (scripts/build-decode-variants -DDK_DENSE_Q8=MASK; the per-task path does not
// follow it, so only the default build is exact against it): 1 Q, 2 the head, 4 the output projection;
// 0 float32 for all three, as before the fortieth session.
#ifndef DK_DENSE_Q8
#define DK_DENSE_Q8 7
#endif
bool dense_q8(const st_decode_ctx *c, uint32_t type, int64_t n, int part) {
  return c->int8_dot && mmv_q8_takes(type, n) && (DK_DENSE_Q8 & part); // st_cuda_matmul's test: the same products
}

// Launches a streaming kernel on at most as many blocks as the device holds at once (at most per_sm
// an SM when per_sm > 0), a multiple of `mult` of them (groups is one).
template <typename K, typename... Args>
void stream_launch(K kernel, int64_t groups, size_t smem, cudaStream_t st, int pdl, int mult, int per_sm, Args... args) {
  int64_t most = mmv_resident_blocks(kernel, smem, per_sm); // at capture time only
  most = most / mult * mult > 0 ? most / mult * mult : mult;
  st_cuda_launch(kernel, dim3((unsigned)(groups < most ? groups : most)), dim3(MMV_THREADS), smem, st, pdl, args...);
}

// out_i = W_i x for the parts (x: n floats; xq: x quantised, which the parts marked q8 take), one dk_mv
// launch per run of parts of one type; amax: the head's argmax keys (dk_segs::amax; one part), else NULL.
void mv_launch(const mv_part *parts, int n_parts, const float *x, const int8_t *xq, int64_t n, int pdl, cudaStream_t st,
               uint64_t *amax = NULL) {
  ST_ASSERT(!amax || n_parts == 1); // the keys carry a row's index in its part
  for (int i = 0; i < n_parts;) {
    const int i0 = i;
    const uint32_t type = parts[i].type;
    while (i < n_parts && i - i0 < 3 && parts[i].type == type) i++;
    mmv_dispatch(type, [&](auto ty) {
      constexpr uint32_t TY = decltype(ty)::value;
      const int R = mmv_stream_rows<TY>(n);
      dk_segs g = {};
      g.amax = (unsigned long long *)amax;
      int64_t groups = 0;
      bool any_q8 = false;
      for (int p = i0; p < i; p++, g.n++) {
        const int q8 = TY == ST_TYPE_Q8_0 && parts[p].q8;
        ST_ASSERT(!q8 || xq);
        g.s[g.n] = dk_seg{(const uint8_t *)parts[p].W, parts[p].row_bytes, parts[p].rows, parts[p].out,
                          (parts[p].rows + R - 1) / R, q8};
        groups += g.s[g.n].groups;
        any_q8 = any_q8 || q8;
      }
      if constexpr (TY == ST_TYPE_Q8_0)
        if (any_q8) return stream_launch(dk_mv<TY, true>, groups, mmv_pipe_bytes<TY>(), st, pdl, 1, 0, g, (int)groups, x, xq, n);
      stream_launch(dk_mv<TY, false>, groups, mmv_pipe_bytes<TY>(), st, pdl, 1, 0, g, (int)groups, x, xq, n);
    });
  }
}

// Once per engine (a device reset at StarPU's shutdown forgets the attributes), on the primary
// GPU's worker thread, before any capture: lets every decode kernel of every format take the
// dynamic shared memory it asks for (the float formats' staging buffers and down's quantised input
// row pass the default 48 KiB), and queues the RoPE table's fill on st (rope_append reads it).
void device_init(const st_decode_ctx *c, cudaStream_t st) {
  if (*c->smem_set) return;
  *c->smem_set = 1;
#ifdef DK_KNOCKOUT
  const int ko = knockout();
  ST_CUDA_CHECK(cudaMemcpyToSymbolAsync(dk_ko, &ko, sizeof ko, 0, cudaMemcpyHostToDevice, st));
#endif
  if (!c->rope_uploaded) st_cuda_rope_table(c->dev.rope, c->n_ctx, c->head_dim, c->rope_theta, st);
  ST_CUDA_CHECK(cudaMemsetAsync(c->dev.amax, 0, 2 * sizeof(uint64_t), st)); // dk_head_done zeroes it after each step
  const int n_embd = c->n_embd, n_expert = c->n_expert;
  for (uint32_t t = 0; t < ST_TYPE_COUNT; t++)
    mmv_dispatch(t, [&](auto ty) {
      constexpr uint32_t TY = decltype(ty)::value;
      // dk_gateup, dk_down: the router's logits (sigmoid routing: scores, then selection values)
      const int p = (int)mmv_pipe_bytes<TY>(), r = p + (int)sizeof(float) * n_embd, pe = p + 2 * (int)sizeof(float) * n_expert;
      ST_CUDA_CHECK(cudaFuncSetAttribute(dk_mv<TY, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, p));
      if constexpr (TY == ST_TYPE_Q8_0) ST_CUDA_CHECK(cudaFuncSetAttribute(dk_mv<TY, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, p));
      ST_CUDA_CHECK(cudaFuncSetAttribute(dk_gateup<TY, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, pe));
      ST_CUDA_CHECK(cudaFuncSetAttribute(dk_down<TY, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, pe));
      ST_CUDA_CHECK(cudaFuncSetAttribute(dk_router<TY>, cudaFuncAttributeMaxDynamicSharedMemorySize, r));
      if constexpr (TY == ST_TYPE_Q8_0 || TY == ST_TYPE_MXFP4) {
        // down's quantised input after the buffers: the longest row a stream takes
        const int q = pe + (int)st_q8_stride(MMV_ITEMS * MMV_CH);
        ST_CUDA_CHECK(cudaFuncSetAttribute(dk_gateup<TY, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, pe));
        ST_CUDA_CHECK(cudaFuncSetAttribute(dk_down<TY, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, q));
      }
    });
}

// Whether the current device takes programmatic dependent launches (compute capability 9.0 or more).
static int pdl_ok() { return st_cuda_compute_capability() >= 90; }

// Whether layer l's input (l = n_layer: the head's) waits for the CPU pool's rows of layer l - 1 in
// the mailbox (codelets/decode.h st_decode_gpu_args); layer l publishes its own for the pool when
// c->layer_cpu[l].
bool cpu_in(const st_decode_ctx *c, int l) { return l > 0 && c->layer_cpu[l - 1]; }

// What a layer's kernels read besides the context: the weight and KV device pointers of the task.
struct layer_graph {
  const st_decode_ctx *c;
  int layer;
  const void *w[9]; // attn_norm wq wk wv wo q_norm k_norm ffn_norm router
  void *k[ST_CUDA_MAX_KV_HEADS], *v[ST_CUDA_MAX_KV_HEADS]; // of c->kv_type
  const void *f[3];        // the fixed FFN's gate, up and down (shared expert, dense FFN), or NULL
  const void *m[ST_MLA_W]; // MLA's matrices and norms (codelets/decode.h), else NULL
  int regime;              // the attention's regime at the token's position (st_cuda_attend_regime; MLA: 0)
};

// The fixed FFN of layer l (a dense layer's FFN or a MoE layer's shared expert) on ffn_in into
// gpu_out's slot k: gate and up (st_cuda_matmul, the rows of any length), silu(gate) up, down;
// float32 activations; plain launches, each waiting for the kernel before it.
void fixed_body(const st_decode_ctx *c, const layer_graph *g, int l, cudaStream_t st) {
  const st_decode_dev &D = c->dev;
  const st_decode_layer *L = &c->layers[l];
  const int d = c->n_embd, ff = L->fixed_ff;
  st_cuda_matmul(L->fgate_d.type, g->f[0], L->fgate_d.row_bytes, 0, ff, D.ffn_in, d, 1, d, D.fgu, ff, st, 0);
  st_cuda_matmul(L->fup_d.type, g->f[1], L->fup_d.row_bytes, 0, ff, D.ffn_in, d, 1, d, D.fgu + ff, ff, st, 0);
  dk_fixed_act<<<(ff + 255) / 256, 256, 0, st>>>(D.fgu, ff, D.fact);
  st_cuda_matmul(L->fdown_d.type, g->f[2], L->fdown_d.row_bytes, 0, d, D.fact, ff, 1, ff, D.gpu_out + (size_t)c->k * d,
                 d, st, 0);
}

// The step number in device memory (after the position).
const uint32_t *dev_seq(const st_decode_dev &D) { return (const uint32_t *)(D.pos + 1); }

// The cached experts of layer l; pdl: the first kernel may overlap the previous one of the graph;
// has_xin: the CPU pool takes the layer's routing and FFN input from the mailbox (dk_gateup's
// block 0 publishes them). With STRATA_INT8_DOT, Q8_0 or MXFP4 gate and up take ffn_in quantised
// (dk_router's ffn_q) and a Q8_0 down its act rows quantised in each block (down_job).
void experts_body(const st_decode_ctx *c, int l, int has_xin, int pdl, cudaStream_t st) {
  const st_decode_dev &D = c->dev;
  const st_decode_layer *L = &c->layers[l];
  const int k = c->k, d = c->n_embd, ff = c->n_ff;
  st_route *route = D.route + (size_t)l * k;
  const uint8_t *const *slots = D.slot_ptr + (size_t)l * c->n_expert;
  const st_decode_mail &M = c->dmail;
  const st_decode_dev_layer *X = c->dlayers ? &c->dlayers[l] : NULL;
  const float *gb = X ? X->gate_b : NULL, *ub = X ? X->up_b : NULL, *db = X ? X->down_b : NULL;
  const int oai = c->ffn_act == ST_ACT_SWIGLU_OAI;
  const int sig = c->gating == ST_GATING_SIGMOID;
  const int grouped = sig && c->n_group > 1 && c->n_group_used < c->n_group; // st_decode_gpu_arch: n_group <= 32
  const int ko = knockout();
  const route_src rs = {D.rlogits, c->n_expert, k, d, c->gating == ST_GATING_SOFTMAX_WEIGHT, sig, c->w_norm, c->w_scale,
                        X ? X->probs_b : (const float *)NULL, grouped ? c->n_group : 0, grouped ? c->n_group_used : 0, route, D.ffn_in, M.xroute + (size_t)l * k,
                        M.xffn + (size_t)l * d, has_xin ? M.xin_seq + (size_t)l * ST_MAIL_FLAG_STRIDE : (uint32_t *)NULL,
                        dev_seq(D), /* tags only where dk_gateup runs (not knocked out) */ DK_DOWN_TAGS && !(ko & 32) ? D.sel_tag + (size_t)l * k : (uint64_t *)NULL};
  const size_t sl = sizeof(float) * (size_t)c->n_expert * (sig ? 2 : 1); // dk_route_select's logits
  if (!(ko & 32)) mmv_dispatch(L->gate_d.type, [&](auto ty) {
    constexpr uint32_t TY = decltype(ty)::value;
    const int H = mmv_stream_rows<TY>(d) / 2; // gpu_layouts_ok: at least 1
    const int per_g = (ff + H - 1) / H, groups = per_g * k;
    if constexpr (TY == ST_TYPE_Q8_0 || TY == ST_TYPE_MXFP4)
      if (q8_on(c, TY, d)) {
        const gateup_job<true> gj = {route, slots, c->n_expert, ff, H, per_g, L->gate_bytes, L->gate_d.row_bytes, D.ffn_q,
                                     D.act, gb, ub, oai};
        return stream_launch(dk_gateup<TY, true>, groups, mmv_pipe_bytes<TY>() + sl, st, pdl, 1, DK_GATEUP_PER_SM, gj, rs, groups, (int64_t)d);
      }
    const gateup_job<false> gj = {route, slots, c->n_expert, ff, H, per_g, L->gate_bytes, L->gate_d.row_bytes, D.ffn_in,
                                  D.act, gb, ub, oai};
    stream_launch(dk_gateup<TY, false>, groups, mmv_pipe_bytes<TY>() + sl, st, pdl, 1, DK_GATEUP_PER_SM, gj, rs, groups, (int64_t)d);
  });
  if (!(ko & 64)) mmv_dispatch(L->down_d.type, [&](auto ty) {
    constexpr uint32_t TY = decltype(ty)::value;
    const int Rd = mmv_stream_rows<TY>(ff);
    const int per_d = (d + Rd - 1) / Rd, groups = per_d * k;
    const uint64_t off = L->gate_bytes + L->up_bytes;
    if constexpr (TY == ST_TYPE_Q8_0 || TY == ST_TYPE_MXFP4)
      if (q8_on(c, TY, ff)) {
        const down_job<true> dj = {route, NULL, slots, c->n_expert, d, Rd, per_d, ff, k, off, L->down_d.row_bytes,
                                   D.act, D.gpu_out, NULL, db};
        return stream_launch(dk_down<TY, true>, groups, mmv_pipe_bytes<TY>() + st_q8_stride(ff) + sl, st, pdl, k, DK_DOWN_PER_SM, dj, rs,
                             groups, (int64_t)ff);
      }
    const down_job<false> dj = {route, NULL, slots, c->n_expert, d, Rd, per_d, ff, k, off, L->down_d.row_bytes, D.act,
                                D.gpu_out, NULL, db};
    stream_launch(dk_down<TY, false>, groups, mmv_pipe_bytes<TY>() + sl, st, pdl, 1, DK_DOWN_PER_SM, dj, rs, groups, (int64_t)ff);
  });
}


// dk_pre over layer l's input (combine: add layer l - 1's expert rows first, waiting for the CPU
// pool's rows in the mailbox when wait_cpu) with norm w: the first kernel of layer l's graph (l =
// n_layer: the head's), a plain launch (no programmatic edge into a graph's first kernel). With
// STRATA_PDL the graph's next kernel (Q/K/V, whose weights no kernel writes) then starts its
// weights' copies while dk_pre's one block works: 2026-12-06 (bench/RESULTS.md), an 8-layer cut's
// step 609.5 -> 594.5 us against dk_pre as the last kernel of layer l - 1's graph.
void pre_launch(const st_decode_ctx *c, int l, int combine, int wait_cpu, const float *w, int quantise, cudaStream_t st) {
  const st_decode_dev &D = c->dev;
  const int lp = l > 0 ? l - 1 : 0;
  const st_decode_layer *P = &c->layers[lp];
  const float *rows = c->dmail.cpu_out + (size_t)lp * c->k * c->n_embd;
  // a dense layer has no routed rows; a fixed FFN's row (slot k of gpu_out) comes after them
  const int n_routed = P->dense ? 0 : c->k;
  const float *fixed = P->fixed_ff ? D.gpu_out + (size_t)c->k * c->n_embd : NULL;
  const uint32_t *flag = wait_cpu ? c->dmail.cpu_seq + (size_t)lp * ST_MAIL_FLAG_STRIDE : NULL;
  st_cuda_launch(dk_pre, dim3(1), dim3(PRE_THREADS), sizeof(float) * (size_t)c->n_embd, st, 0,
                 (const st_route *)(D.route + (size_t)lp * c->k), (const uint8_t *const *)(D.slot_ptr + (size_t)lp * c->n_expert),
                 c->n_expert, (const float *)D.gpu_out, rows, flag, dev_seq(D), (const float *)D.h, n_routed, c->n_embd,
                 combine, (const float *)c->dmail.emb, (const int32_t *)c->dmail.pos_seq, D.pos, D.counters, c->n_head, D.x,
                 w, c->eps, D.xn, quantise ? D.xnq : (int8_t *)NULL, fixed, combine ? (uint64_t *)NULL : c->dmail.stamps,
                 !combine && c->presubmit);
}

// MLA's attention of a layer (mla.cuh) from xn to D.attn ([n_head][head_dim_v]): q (wq, or q_a,
// its norm and q_b) and kv_a_mqa; the cache row and the absorbed queries; the split attention and
// its merge; v_b, and with oq D.attn quantised there too (dk_mla_vb). Plain launches after the first
// (pdl: whether that one may overlap the kernel before it).
void mla_body(const st_decode_ctx *c, const layer_graph *g, int pdl, int8_t *oq, cudaStream_t st) {
  const st_decode_dev &D = c->dev;
  const st_decode_layer *L = &c->layers[g->layer];
  const int d = c->n_embd, Hq = c->n_head, hd = c->head_dim, nr = c->rope.n_rot, qk = c->qk_nope + nr;
  const mv_part in[2] = {c->q_lora ? mv_part{L->wq_a_d.type, g->m[MLA_Q_A], L->wq_a_d.row_bytes, c->q_lora, D.qa}
                                   : mv_part{L->wq_d.type, g->w[1], L->wq_d.row_bytes, (int64_t)Hq * qk, D.q},
                         {L->wkv_a_d.type, g->m[MLA_KV_A], L->wkv_a_d.row_bytes, hd, D.kvnew}};
  mv_launch(in, 2, D.xn, NULL, d, pdl, st);
  if (c->q_lora) {
    dk_mla_qnorm<<<1, MLA_THREADS, 0, st>>>(D.qa, (const float *)g->m[MLA_Q_A_NORM], c->q_lora, c->eps);
    const mv_part qb = {L->wq_b_d.type, g->m[MLA_Q_B], L->wq_b_d.row_bytes, (int64_t)Hq * qk, D.q};
    mv_launch(&qb, 1, D.qa, NULL, c->q_lora, 0, st);
  }
  const int n_chunks = (L->kv_rows + MLA_CHUNK - 1) / MLA_CHUNK;
  const size_t smem = sizeof(float) * (size_t)(hd + MLA_CHUNK);
  auto run = [&](auto kt) {
    using KT = decltype(kt);
    dk_mla_prep<KT><<<Hq + 1, MLA_THREADS, 0, st>>>(D.q, Hq, c->qk_nope, nr, c->kv_lora, hd, D.rope, D.pos, L->wk_b_d.type,
                                                    (const uint8_t *)g->m[MLA_K_B], L->wk_b_d.row_bytes, D.qm, D.kvnew,
                                                    (const float *)g->m[MLA_KV_A_NORM], c->eps, (KT *)g->k[0], L->kv_rows);
    dk_mla_attend<KT><<<dim3(Hq, n_chunks), MLA_THREADS, smem, st>>>(D.qm, hd, c->kv_lora, (const KT *)g->k[0], D.pos,
                                                                      c->attn_conf.scale, D.part, n_chunks);
  };
  ST_ASSERT(c->kv_type == ST_TYPE_F16 || c->kv_type == ST_TYPE_F32); // the engine refuses a q8_0 MLA cache on a GPU
  if (c->kv_type == ST_TYPE_F16) run(__half());
  else run(0.0f);
  dk_mla_merge<<<Hq, MLA_THREADS, 0, st>>>(D.part, n_chunks, c->kv_lora, D.pos, D.olat);
  dk_mla_vb<<<Hq, MLA_THREADS, 0, st>>>(D.olat, c->kv_lora, L->wv_b_d.type, (const uint8_t *)g->m[MLA_V_B],
                                        L->wv_b_d.row_bytes, c->head_dim_v, D.attn, oq);
}

void layer_body(const layer_graph *g, cudaStream_t st) {
  const st_decode_ctx *c = g->c;
  const st_decode_dev &D = c->dev;
  const st_decode_layer *L = &c->layers[g->layer];
  const int d = c->n_embd, hd = c->head_dim, G = c->n_head_kv, Hq = c->n_head, E = c->n_expert;
  const int pdl = c->pdl && pdl_ok();
  const int ko = knockout();
  const int q8 = !c->mla && dense_q8(c, L->wq_d.type, d, DQ8_Q); // Q takes xn quantised
  if (!(ko & 1) || g->layer == 0) pre_launch(c, g->layer, g->layer > 0, cpu_in(c, g->layer), (const float *)g->w[0], q8, st);
  const int hv = c->mla ? c->head_dim_v : hd; // a head of the attention's output
  const int64_t o_in = (int64_t)Hq * hv;      // the output projection's input
  const bool q8o = dense_q8(c, L->wo_d.type, o_in, DQ8_O);
  // the attention's blocks quantise the heads they write where a head is whole 32-element blocks
  int8_t *oq = q8o && hv % 32 == 0 ? D.attnq : NULL;
  const st_decode_dev_layer *X = c->dlayers ? &c->dlayers[g->layer] : NULL;
  if (c->mla) {
    mla_body(c, g, pdl, oq, st);
  } else {
  const mv_part qkv[3] = {{L->wq_d.type, g->w[1], L->wq_d.row_bytes, (int64_t)Hq * hd, D.q, q8},
                          {L->wk_d.type, g->w[2], L->wk_d.row_bytes, (int64_t)G * hd, D.kvnew, 0},
                          {L->wv_d.type, g->w[3], L->wv_d.row_bytes, (int64_t)G * hd, D.kvnew + (size_t)G * hd, 0}};
  if (!(ko & 2)) mv_launch(qkv, 3, D.xn, D.xnq, d, pdl, st); // after dk_pre
  // short contexts: the attention in rope_append's launch, the split-K kernels leave at once
  // another architecture's biases, sinks, q.k scale and sliding window (qwen3moe: none, its bits)
  st_cuda_attn_ext ax = {};
  if (X) {
    ax = st_cuda_attn_ext{X->bq, X->bk, X->bv, X->sinks, c->attn_conf.scale, L->swa ? c->attn_conf.window : 0,
                          L->swa && L->kv_rows < c->n_ctx ? L->kv_rows : 0, c->rope.n_rot < hd ? c->rope.n_rot : 0};
  }
  if (!(ko & 4)) {
    st_cuda_rope_append(D.q, Hq, D.kvnew, G, hd, L->q_norm ? (const float *)g->w[5] : NULL,
                        L->k_norm ? (const float *)g->w[6] : NULL, c->eps, D.pos, c->kv_type, g->k, g->v, D.rope, D.attn,
                        pdl, st, X ? &ax : NULL, oq);
    st_cuda_attend_decode_all(D.q, Hq, G, hd, c->kv_type, g->k, g->v, D.pos, D.part, D.counters, D.attn, 1, pdl, st,
                              X ? &ax : NULL, g->regime, oq);
  }
  }
  // else (a head not whole 32-element blocks) one launch quantises the row, as st_cuda_matmul does
  if (q8o && !oq) st_cuda_quantize_rows(D.attn, o_in, 1, o_in, D.attnq, st);
  const mv_part o = {L->wo_d.type, g->w[4], L->wo_d.row_bytes, d, D.xo, q8o};
  if (!(ko & 8)) mv_launch(&o, 1, D.attn, D.attnq, o_in, c->mla ? 0 : pdl, st);
  // a dense layer: no router rows (one block computes h and ffn_in), no routed experts
  const int Er = L->dense ? 0 : E;
  if (!(ko & 16)) mmv_dispatch(L->dense ? (uint32_t)ST_TYPE_F32 : L->router_d.type, [&](auto ty) {
    constexpr uint32_t TY = decltype(ty)::value;
    const int Rr = dk_router_rows<TY>(d);
    auto kernel = dk_router<TY>;
    const size_t dyn = mmv_pipe_bytes<TY>() + sizeof(float) * (size_t)d;
    st_cuda_launch(kernel, dim3((unsigned)(Er ? (Er + Rr - 1) / Rr : 1)), dim3(MMV_THREADS), dyn, st, pdl, D.x, D.xo,
                   (const float *)g->w[7], c->eps, d, (const uint8_t *)g->w[8], L->router_d.row_bytes, Er, D.h, D.ffn_in,
                   D.rlogits, q8_on(c, L->gate_d.type, d) ? D.ffn_q : (int8_t *)NULL, X ? X->bo : (const float *)NULL,
                   X ? X->router_b : (const float *)NULL);
  });
  if (!L->dense) experts_body(c, g->layer, c->layer_cpu[g->layer], pdl, st);
  if (L->fixed_ff) fixed_body(c, g, g->layer, st);
}

// The kernels of a span's layers in order, into one graph (each layer's first kernel, dk_pre, a
// plain launch). On an H100 (2026-12-06, doc/tuning.md STRATA_LAYER_SPAN) a graph a layer cost
// about 3 us more a layer than the same kernels one after another in one graph.
struct span_graph {
  int n;
  const layer_graph *g;
};
void span_body(const void *args, cudaStream_t st) {
  const span_graph *s = (const span_graph *)args;
  for (int i = 0; i < s->n; i++) layer_body(&s->g[i], st);
}

struct head_graph {
  const st_decode_gpu_args *a;
  const float *norm;
  const void *w;
};

// The step's routing to the mailbox (n entries) and the logits' argmax (amax, the head's atomics:
// argmax[0] its id, argmax[1] 1 when a logit was not finite), amax zeroed for the next step; then,
// once every write of the step to the mailbox is out (the head's logits came from the previous
// kernel), *flag = *seq; *stamp: the GPU's clock. One block.
__global__ void dk_head_done(const st_route *route, int n, st_route *to, uint64_t *amax, int32_t *argmax, uint32_t *flag,
                             const uint32_t *seq, uint64_t *stamp) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) to[i] = route[i];
  if (threadIdx.x == 0) {
    const uint64_t key = amax[0], bad = amax[1];
    argmax[0] = key ? st_argmax_key_id(key) : 0;
    argmax[1] = bad || !key; // no finite logit at all: the host looks at them itself
    amax[0] = amax[1] = 0;
    *(volatile uint64_t *)stamp = st_dev_globaltimer();
  }
  dk_raise(flag, seq);
}

void head_body(const void *args, cudaStream_t st) {
  const head_graph *g = (const head_graph *)args;
  const st_decode_ctx *c = g->a->ctx;
  const st_decode_dev &D = c->dev;
  const int q8 = dense_q8(c, c->output_d.type, c->n_embd, DQ8_HEAD);
  const mv_part head = {c->output_d.type, g->w, c->output_d.row_bytes, c->n_vocab, c->dmail.logits, q8};
  pre_launch(c, c->n_layer, 1, cpu_in(c, c->n_layer), g->norm, q8, st); // the last layer's combine, the output norm
  mv_launch(&head, 1, D.xn, D.xnq, c->n_embd, c->pdl && pdl_ok(), st, D.amax);
  dk_head_done<<<1, 256, 0, st>>>(D.route, c->n_layer * c->k, c->dmail.route, D.amax, c->dmail.argmax, c->dmail.head_seq,
                                  dev_seq(D), c->dmail.stamps + 1);
}

// Graph keys: graph_key0 + 9 l + r the task of the span from layer l whose full-attention layers
// are of attention regime r % 3 and sliding-window ones of r / 3 (a layer's kernels are only the
// attention kernels its regime needs), graph_key0 + 9 n_layer the head.
int key_of(const st_decode_ctx *c, int layer, int kind) { return c->graph_key0 + 9 * layer + kind; }

void decode_gpu_run(void *buffers[], void *cl_arg);

void decode_gpu_cuda(void *buffers[], void *cl_arg) {
  const double t0 = st_cuda_now_ns();
  decode_gpu_run(buffers, cl_arg);
  st_cuda_decode_host_time(t0);
}

// FNV-1a over the words that went into a graph's kernel arguments.
struct sig_hash {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t v) {
    for (int b = 0; b < 8; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  void add(const void *p) { add((uint64_t)(uintptr_t)p); }
};

void decode_gpu_run(void *buffers[], void *cl_arg) {
  const st_decode_gpu_args *a = (const st_decode_gpu_args *)cl_arg;
  const st_decode_ctx *c = a->ctx;
  cudaStream_t st = starpu_cuda_get_local_stream();
  device_init(c, st);
  sig_hash sig;
  if (a->layer == c->n_layer) {
    head_graph g = {a, (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), (const void *)STARPU_VECTOR_GET_PTR(buffers[1])};
    sig.add(g.norm);
    sig.add(g.w);
    sig.add((uint64_t)cpu_in(c, c->n_layer));
    st_cuda_graph_replay(st, key_of(c, c->n_layer, 0), sig.h, head_body, &g);
    ST_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int G = c->n_head_kv, planes = c->mla ? 1 : 2; // graph/layer.c's order
  static thread_local std::vector<layer_graph> gs; // the worker's, reused step to step
  gs.assign((size_t)a->n_layers, layer_graph{});
  int b = 0, r_full = 0, r_swa = 0;
  for (int i = 0; i < a->n_layers; i++) {
    layer_graph &g = gs[(size_t)i];
    const int l = a->layer + i;
    g.c = c;
    g.layer = l;
    for (int w = 0; w < 9; w++) {
      g.w[w] = (const void *)STARPU_VECTOR_GET_PTR(buffers[b++]);
      sig.add(g.w[w]);
    }
    for (int gi = 0; gi < G; gi++) {
      g.k[gi] = (void *)STARPU_VECTOR_GET_PTR(buffers[b++]);
      g.v[gi] = planes == 2 ? (void *)STARPU_VECTOR_GET_PTR(buffers[b++]) : NULL;
      sig.add(g.k[gi]);
      sig.add(g.v[gi]);
    }
    for (int f = 0; f < 3; f++) {
      g.f[f] = c->layers[l].fixed_ff ? (const void *)STARPU_VECTOR_GET_PTR(buffers[b++]) : NULL;
      sig.add(g.f[f]);
    }
    for (int m = 0; m < ST_MLA_W && c->mla; m++) {
      g.m[m] = (const void *)STARPU_VECTOR_GET_PTR(buffers[b++]);
      sig.add(g.m[m]);
    }
    sig.add((uint64_t)(cpu_in(c, l) | (c->layer_cpu[l] != 0) << 1)); // the mailbox's waits and hand-overs
    if (!c->mla) {
      const int swa = c->layers[l].swa;
      g.regime = st_cuda_attend_regime(c->head_dim, c->kv_type, a->pos, swa ? c->attn_conf.window : 0);
      (swa ? r_swa : r_full) = g.regime;
    }
  }
  const span_graph sg = {a->n_layers, gs.data()};
  st_cuda_graph_replay(st, key_of(c, a->layer, r_full + 3 * r_swa), sig.h, span_body, &sg);
  ST_CUDA_CHECK(cudaGetLastError());
}

starpu_codelet decode_gpu_cl = [] {
  starpu_codelet cl = {};
  cl.cuda_funcs[0] = decode_gpu_cuda;
  cl.cuda_flags[0] = STARPU_CUDA_ASYNC;
  cl.nbuffers = STARPU_VARIABLE_NBUFFERS;
  cl.name = "decode_layer";
  return cl;
}();

} // namespace

extern "C" size_t st_cuda_mla_part_floats(int n_ctx, int n_heads, int kv_lora) {
  return mla_part_floats(n_ctx, n_heads, kv_lora);
}

extern "C" int st_cuda_mla_check(int n_head, int qk_nope, int n_rot, int kv_lora, int hv, int pos, int kv_type,
                                 const float *q, const float *kvnew, const float *kv_norm, float eps, const float *rows,
                                 const float *cs, const float *k_b, const float *v_b, float scale, float *attn, float *row) {
  const int hd = kv_lora + n_rot, qk = qk_nope + n_rot, n_chunks = (pos + MLA_CHUNK) / MLA_CHUNK;
  if (kv_type != ST_TYPE_F16 && kv_type != ST_TYPE_F32) return -1; // MLA's cache on the GPU: f16 or f32
  const size_t es = kv_type == ST_TYPE_F16 ? 2 : 4, nrow = (size_t)pos + 1;
  float *dq = NULL, *dkv = NULL, *dnorm = NULL, *dtab = NULL, *dkb = NULL, *dvb = NULL, *dqm = NULL, *dpart = NULL,
        *dolat = NULL, *dattn = NULL, *drows = NULL;
  void *dcache = NULL;
  int32_t *dpos = NULL;
  bool ok = cudaMalloc(&dq, sizeof(float) * n_head * qk) == cudaSuccess && cudaMalloc(&dkv, sizeof(float) * hd) == cudaSuccess &&
            cudaMalloc(&dnorm, sizeof(float) * kv_lora) == cudaSuccess &&
            cudaMalloc(&dtab, sizeof(float) * nrow * hd) == cudaSuccess &&
            cudaMalloc(&dkb, sizeof(float) * n_head * kv_lora * qk_nope) == cudaSuccess &&
            cudaMalloc(&dvb, sizeof(float) * n_head * hv * kv_lora) == cudaSuccess &&
            cudaMalloc(&dqm, sizeof(float) * n_head * hd) == cudaSuccess &&
            cudaMalloc(&dpart, sizeof(float) * mla_part_floats((int)nrow, n_head, kv_lora)) == cudaSuccess &&
            cudaMalloc(&dolat, sizeof(float) * n_head * kv_lora) == cudaSuccess &&
            cudaMalloc(&dattn, sizeof(float) * n_head * hv) == cudaSuccess &&
            cudaMalloc(&drows, sizeof(float) * nrow * hd) == cudaSuccess && cudaMalloc(&dcache, es * nrow * hd) == cudaSuccess &&
            cudaMalloc(&dpos, sizeof(int32_t)) == cudaSuccess;
  ok = ok && cudaMemcpy(dq, q, sizeof(float) * n_head * qk, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dkv, kvnew, sizeof(float) * hd, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dnorm, kv_norm, sizeof(float) * kv_lora, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dtab + (size_t)pos * hd, cs, sizeof(float) * n_rot, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dkb, k_b, sizeof(float) * n_head * kv_lora * qk_nope, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(dvb, v_b, sizeof(float) * n_head * hv * kv_lora, cudaMemcpyHostToDevice) == cudaSuccess &&
       (pos == 0 || cudaMemcpy(drows, rows, sizeof(float) * pos * hd, cudaMemcpyHostToDevice) == cudaSuccess) &&
       cudaMemcpy(dpos, &pos, sizeof pos, cudaMemcpyHostToDevice) == cudaSuccess;
  if (ok) {
    auto run = [&](auto kt) {
      using KT = decltype(kt);
      // the earlier rows into the cache as KT, then the decode step's kernels
      dk_mla_store<KT><<<64, MLA_THREADS>>>(drows, (int64_t)pos * hd, (KT *)dcache);
      dk_mla_prep<KT><<<n_head + 1, MLA_THREADS>>>(dq, n_head, qk_nope, n_rot, kv_lora, hd, dtab, dpos, ST_TYPE_F32,
                                                   (const uint8_t *)dkb, sizeof(float) * qk_nope, dqm, dkv, dnorm, eps,
                                                   (KT *)dcache, (int)nrow);
      dk_mla_attend<KT><<<dim3(n_head, n_chunks), MLA_THREADS, sizeof(float) * (hd + MLA_CHUNK)>>>(
          dqm, hd, kv_lora, (const KT *)dcache, dpos, scale, dpart, n_chunks);
      dk_mla_load<KT><<<64, MLA_THREADS>>>((const KT *)dcache + (size_t)pos * hd, hd, drows);
    };
    if (kv_type == ST_TYPE_F16) run(__half());
    else run(0.0f);
    dk_mla_merge<<<n_head, MLA_THREADS>>>(dpart, n_chunks, kv_lora, dpos, dolat);
    dk_mla_vb<<<n_head, MLA_THREADS>>>(dolat, kv_lora, ST_TYPE_F32, (const uint8_t *)dvb, sizeof(float) * kv_lora, hv, dattn, NULL);
    ok = cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess &&
         cudaMemcpy(attn, dattn, sizeof(float) * n_head * hv, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(row, drows, sizeof(float) * hd, cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  void *all[] = {dq, dkv, dnorm, dtab, dkb, dvb, dqm, dpart, dolat, dattn, drows, dcache, dpos};
  for (void *p : all) cudaFree(p);
  cudaGetLastError();
  return ok ? 0 : -1;
}

// For tests (declared in tests/test_cuda_kernels.c): out[r] = W[r] . x for `rows` rows of n weights
// (row_bytes apart) and one float32 activation row, all in host memory, through the decode step's
// streaming core (dk_mv, mmv.cuh mmv_stream) on `grid` blocks, fewer than the groups so that each
// block walks several of them through both staging buffers. 0, or -1 on a CUDA error or a type
// without a specialised kernel.
extern "C" int st_cuda_stream_rows(uint32_t type, const void *W, uint64_t row_bytes, int64_t rows, const float *x,
                                   int64_t n, int grid, float *out) {
  uint8_t *dw = NULL;
  float *dx = NULL, *dout = NULL;
  const size_t wb = row_bytes * (size_t)rows;
  bool ok = cudaMalloc(&dw, wb) == cudaSuccess && cudaMalloc(&dx, sizeof(float) * (size_t)n) == cudaSuccess &&
            cudaMalloc(&dout, sizeof(float) * (size_t)rows) == cudaSuccess &&
            cudaMemcpy(dw, W, wb, cudaMemcpyHostToDevice) == cudaSuccess &&
            cudaMemcpy(dx, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice) == cudaSuccess;
  const bool typed = mmv_dispatch(type, [&](auto ty) {
    constexpr uint32_t TY = decltype(ty)::value;
    if (!ok) return;
    const size_t smem = mmv_pipe_bytes<TY>();
    ok = cudaFuncSetAttribute(dk_mv<TY, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess;
    const int R = mmv_stream_rows<TY>(n);
    dk_segs g = {};
    g.s[0] = dk_seg{dw, row_bytes, rows, dout, (rows + R - 1) / R};
    g.n = 1;
    if (ok) dk_mv<TY, false><<<grid, MMV_THREADS, smem>>>(g, (int)g.s[0].groups, (const float *)dx, (const int8_t *)NULL, n);
  });
  ok = ok && typed && cudaGetLastError() == cudaSuccess &&
       cudaMemcpy(out, dout, sizeof(float) * (size_t)rows, cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(dw);
  cudaFree(dx);
  cudaFree(dout);
  cudaGetLastError();
  return ok ? 0 : -1;
}

extern "C" int st_cuda_mmv_takes(uint32_t type, uint64_t row_bytes, int64_t n) {
  bool ok = false;
  mmv_dispatch(type, [&](auto ty) {
    constexpr uint32_t T = decltype(ty)::value;
    int dev = 0, smem = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
      cudaGetLastError();
    ok = n % mmv_format<T>::QK == 0 && row_bytes % mmv_format<T>::ALIGN == 0 &&
         mmv_pipe_bytes<T>() + sizeof(float) * (4096 + 1024) <= (size_t)smem;
  });
  return ok;
}

extern "C" int st_submit_decode_gpu(const st_decode_gpu_args *a, size_t args_size, starpu_data_handle_t *bufs,
                                    const enum starpu_data_access_mode *modes, int nbufs, st_target tgt, const char *name) {
  return st_submit_task(&decode_gpu_cl, bufs, modes, nbufs, a, args_size, tgt, name);
}
