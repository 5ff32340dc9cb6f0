// The fused attention backward's key-tile kernel on Hopper's warpgroup
// products (wgmma, sm_90a; built for that architecture alone,
// core/cuda/CMakeLists.txt): the scheme of the mma.sync one
// (flash_attention_backward.cu, which launches this one when
// set_flash_backward_uses_wgmma chose it) with its five products on wgmma.
// A block owns 128 keys as two warpgroups of 64 and streams the query tiles
// of 64 past them; per query tile each warpgroup computes
//   S^T = K Q^T and dP^T = V dO^T   (both operands from shared memory),
//   dV += P^T dO and dK += dS^T Q   (P^T and dS^T from registers, dO and Q
//                                    read N-major),
// and dQ = dS K over its 64 keys (dS^T staged in shared memory, read
// M-major; K read N-major), the two halves of dQ summed through shared
// memory and added to the split's running sums as the mma.sync kernel adds
// them. Tiles live in the 128-byte
// swizzle (SwizzledTile); the softmax, dropout and the running sums are the
// mma.sync kernel's, element for element, so the results agree with it to
// f32 rounding (the products may sum in another order) and dk, dv, dq keep
// their one owner each: the same bits on every run.
#include "core/cuda/kernels/flash_attention_key_tiles.cuh"
#include "core/cuda/kernels/wgmma.cuh"

namespace roformer::kernels::cuda {

namespace {

// kRotateLoads: Q and K tiles rotated as they load (RoPE inside); compiled
// apart, so the kernel the model runs (q and k rotated once: only the
// gradients rotated, at the stores) carries none of that code.
template <bool kDropout, bool kRotateLoads>
__global__ void __launch_bounds__(kThreadsPerBlock, 1)
    flash_key_tile_wgmma_kernel(FlashArgs a, int64_t tiles, DqPartials partials,
                                bool alternate_sweeps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(ROFORMER_SIMT_EMULATION)
  RF_DYNAMIC_SHARED(smem);
  // bf16 tiles first, each a whole number of 1024-byte swizzle atoms.
  bf16_t* sK = reinterpret_cast<bf16_t*>(swizzle_aligned(smem));
  bf16_t* sV = sK + kRowsPerBlock * kD;
  bf16_t* sK2 = sV + kRowsPerBlock * kD;  // the next key tile's K and V
  bf16_t* sV2 = sK2 + kRowsPerBlock * kD;
  bf16_t* sQ = sV2 + kRowsPerBlock * kD;   // two tiles of kInnerTile rows
  bf16_t* sO = sQ + 2 * kInnerTile * kD;   // dO, two tiles
  bf16_t* sDs = sO + 2 * kInnerTile * kD;  // dS^T [keys][queries]
  const DqPartialTiles sums{reinterpret_cast<float*>(sDs + kRowsPerBlock * kD)};
  float* sDq = sums.end();  // [kInnerTile][kAccLd]: dQ tiles each warpgroup hands the other
  const QueryRowData rows{sDq + kInnerTile * kAccLd};  // two buffers
  float* sAngles = rows.end();
  const Block r = block_of(a, tiles);
  constexpr bool rotate_loads = kRotateLoads;
  const bool rotate_grads = a.table != nullptr;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int group = warpgroup_index();  // keys 64 group... of the block's 128
  const Operand slice = split_slice(partials, r);
  const bool sums_kept = slice.ptr != nullptr;
  const int64_t row_words = (r.Lk + 31) / 32;
  __shared__ RowStream streams[kKeyTileStreams];
  if (threadIdx.x == 0) fill_key_tile_streams<kDropout>(streams, a, r, slice);
  __syncthreads();
  const StreamedPair<kThreadsPerBlock, SwizzledTile> qo{
      sQ, sO, streams[kStreamQ], streams[kStreamO], rotate_loads ? sAngles : nullptr};
  // The angles of the query tile in `buffer`, for dq's rotation as it is
  // stored with q and k rotated once: staged beside the running sums of the
  // sweep that writes dq (`stage_angles`), so the stores wait on no table
  // load.
  const auto tile_angles = [sAngles](int buffer) { return buffer_angle_slots(sAngles, buffer); };
  // dQ's two halves meet in shared memory, split by columns so that every
  // warp does the same work: warp w of each warpgroup holds the same 16
  // query rows; it keeps the column tiles kept_tile(., group) of them (0, 1,
  // 4, 5 or 2, 3, 6, 7: RoPE's pairs, 32 columns apart in the half layout,
  // stay with one thread) and hands the other four to its twin in the other
  // warpgroup.
  const int local = warp % 4;  // rows 16 local... of the tile
  const auto kept_tile = [](int n, int owner) { return (n & 1) + 2 * owner + 4 * (n >> 1); };
  // Row half hf of tile kept_tile(n, owner) of acc, for an owner known at
  // run time: a select between compile-time indices (acc indexed by the
  // warp's group would go to local memory).
  const auto kept_pair = [kept_tile](const float(&acc)[8][4], int n, int owner, int hf) {
    return owner == 0 ? make_float2(acc[kept_tile(n, 0)][2 * hf], acc[kept_tile(n, 0)][2 * hf + 1])
                      : make_float2(acc[kept_tile(n, 1)][2 * hf], acc[kept_tile(n, 1)][2 * hf + 1]);
  };
  // Queues key tile j0's K and V into the given buffers.
  const auto queue_key_tile = [&r](bf16_t* k_dst, bf16_t* v_dst, int64_t j0) {
    copy_tile_async<kRowsPerBlock, kThreadsPerBlock, SwizzledTile>(k_dst, streams[kStreamK], j0,
                                                                   r.Lk);
    copy_tile_async<kRowsPerBlock, kThreadsPerBlock, SwizzledTile>(v_dst, streams[kStreamV], j0,
                                                                   r.Lk);
  };
  bf16_t *k_tile = sK, *v_tile = sV, *next_k = sK2, *next_v = sV2;
  const int64_t query_tiles = (r.Lq + kInnerTile - 1) / kInnerTile;
  int64_t sweep = 0;  // the key tiles this block has swept its query rows for
  for (int64_t kt = r.tile; kt * kRowsPerBlock < r.Lk; kt += tiles, ++sweep) {
    const int64_t j0 = kt * kRowsPerBlock, first_word = j0 / 32;
    // The query tile at `step` of this sweep. Alternating sweeps
    // (set_flash_backward_alternates_sweeps) run every other one downwards,
    // so it starts on the rows the last one left in L2; each row still adds
    // the key tiles in order (dq's bits unchanged), dk and dv sum the query
    // tiles in the sweep's order.
    const bool downwards = alternate_sweeps && (sweep & 1) != 0;
    const auto rows_at = [downwards, query_tiles](int64_t step) {
      return (downwards ? query_tiles - 1 - step : step) * kInnerTile;
    };
    const int64_t start = query_tiles > 0 ? rows_at(0) : 0;
    const bool first = kt == r.tile || !sums_kept;
    const bool last = (kt + tiles) * kRowsPerBlock >= r.Lk;
    const bool dq_final = last && partials.splits == 1;
    const bool stage_angles = !rotate_loads && rotate_grads && dq_final;
    const bool came_early = kt != r.tile && r.Lq > 0;
    // Queues the row data of the query tile at rows i0 into `buffer`.
    const auto fetch_rows = [&](int buffer, int64_t i0) {
      rows.fetch(buffer, streams[kStreamLse], streams[kStreamDelta], streams[kStreamBits], r.Lq, i0,
                 first_word, row_words, kDropout);
    };
    // This sweep's first tile, and the key tile's K and V unless they came
    // early: one copy group, waited for at once (nothing else to run yet).
    if (r.Lq > 0) {
      fetch_rows(0, start);
      if (!first) sums.fetch(0, streams[kStreamSums], r.Lq, start);
      if (!came_early) queue_key_tile(k_tile, v_tile, j0);
      if (stage_angles)
        copy_angles_async<kInnerTile, kThreadsPerBlock>(tile_angles(0), r, start, r.Lq, a);
      qo.fetch(0, r, start, r.Lq, a);
      cp_async_wait<0>();
      qo.rotate_first(0, start, r.Lq, a);
      if (rotate_loads)
        rotate_own_chunks_by_table<kRowsPerBlock, kThreadsPerBlock, SwizzledTile>(k_tile, r, j0,
                                                                                  r.Lk, a);
      rows.prepare(0, a.scale);
    }
    const int64_t key0 = j0 + warp * 16;
    const bool masked = key_tile_masked(a, r, j0, kRowsPerBlock);
    float key_bias_of[2];
    key_biases_of(key_bias_of, a, r, key0, masked, g);
    // This warpgroup's 64 keys of K and V (whole swizzle atoms).
    const bf16_t* k_rows = k_tile + group * 64 * kD;
    const bf16_t* v_rows = v_tile + group * 64 * kD;
    float dk[8][4] = {}, dv[8][4] = {};
    // A tile's dQ is finished (the twin's half added, then the split's
    // running sums, and stored) in the next tile, beside that tile's
    // products and the other warpgroup's exponents or gradients: `own`
    // carries this warp's kept half from one tile to the next.
    float own[4][4] = {};
    const auto finish_dq = [&](int64_t i0, int buffer) {
      const float* staged = sums.tile(buffer);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = local * 16 + g + 8 * hf;
#pragma unroll
        for (int n = 0; n < 4; ++n) {  // the twin's half (a + b is b + a: the same bits)
          const int nt = kept_tile(n, group);
          const float2 o = *reinterpret_cast<const float2*>(sDq + row * kAccLd + nt * 8 + 2 * t);
          own[n][2 * hf] += o.x;
          own[n][2 * hf + 1] += o.y;
        }
        if (first || i0 + row >= r.Lq) continue;
#pragma unroll
        for (int n = 0; n < 4; ++n) {  // the sums of the split's earlier key tiles
          const int nt = kept_tile(n, group);
          const float2 o = *reinterpret_cast<const float2*>(staged + row * kAccLd + nt * 8 + 2 * t);
          own[n][2 * hf] += o.x;
          own[n][2 * hf + 1] += o.y;
        }
      }
      const int64_t q0 = i0 + local * 16;  // this warp's 16 query rows
      const float one[2] = {1.0f, 1.0f};
      const auto tile_of = [group, kept_tile](int n) { return kept_tile(n, group); };
      if (dq_final) {
        // With RoPE inside, qo's angle slots for this tile already take the
        // tile after next: dq's angles come from the table.
        if constexpr (kRotateLoads)
          store_row_tiles(own, tile_of, OperandRows{a.dq, r}, a.grad_dtype, r, q0, r.Lq, one, a,
                          rotate_grads, g, t);
        else
          store_row_tiles<true>(own, tile_of, OperandRows{a.dq, r}, a.grad_dtype, r, q0, r.Lq, one,
                                a, rotate_grads, g, t,
                                tile_angles(buffer) + local * 16 * 4 * kAngleSlot);
      } else if (sums_kept) {
        store_row_tiles(own, tile_of, StreamRows{streams[kStreamSums]}, DType::f32, r, q0, r.Lq,
                        one, a, false, g, t);
      }
    };
    int buffer = 0;
    for (int64_t step = 0; step < query_tiles; ++step, buffer ^= 1) {
      const int64_t next = step + 1 < query_tiles ? rows_at(step + 1) : r.Lq;  // r.Lq: none
      const bf16_t* q_tile = qo.first(buffer);
      const bf16_t* o_tile = qo.second(buffer);
      const float* sLse2 = rows.lse(buffer);
      const float* sDScaled = rows.delta(buffer);
      const uint32_t* sBits = rows.bits(buffer);
      // This tile's Q, dO and row data have landed (each thread's own
      // copies, waited for at the end of the last tile, or at the sweep's
      // start for its first), and the last tile's dQ halves are in sDq.
      fence_shared_for_wgmma();  // the tiles this thread wrote or rotated, for the products
      __syncthreads();
      // S^T and dP^T: rows this warpgroup's keys, columns the tile's queries.
      float st[8][4], dpt[8][4];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_ss(st, k_major_step(k_rows, ks), k_major_step(q_tile, ks), ks > 0);
      wgmma_commit();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_ss(dpt, k_major_step(v_rows, ks), k_major_step(o_tile, ks), ks > 0);
      wgmma_commit();
      // While they run, the next tile's copies are queued into the buffers
      // the last tile used (its products were waited for before the barrier
      // above). What the last tile's dQ still reads, the staged sums and
      // dq's angles, is queued only after the next barrier.
      if (step == 0 && !last) queue_key_tile(next_k, next_v, j0 + tiles * kRowsPerBlock);
      if (next < r.Lq) fetch_rows(buffer ^ 1, next);
      qo.fetch(buffer ^ 1, r, next, r.Lq, a);  // commits (an empty group past the last tile)
      // The last tile's dQ is finished by the second warpgroup before P^T's
      // exponents, by the first once its dV and dK are issued: on each
      // scheduler (a warp of each warpgroup) one warp's exponents (the
      // SFUs) run beside the other's adds and stores, and the first
      // warpgroup's tail beside the second's gradients, with its products
      // on the tensor cores. No branch between the wait and the exponents:
      // ptxas puts the wait at the top of the block after the last branch
      // before it.
      if (step > 0 && group == 1) finish_dq(rows_at(step - 1), buffer ^ 1);
      wgmma_wait<1>();
      fence_accumulator(st);
      key_tile_exponents(st, masked, key_bias_of, sLse2, a, t);
      wgmma_wait<0>();
      fence_accumulator(dpt);
      key_tile_gradients<kDropout>(st, dpt, sDScaled, sBits, a, warp * 16, g, t);
      uint32_t pa[4][4], dsa[4][4];  // P^T and dS^T as the products' A (k: queries)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        accumulator_as_a(pa[kk], st, kk);
        accumulator_as_a(dsa[kk], dpt, kk);
      }
      fence_accumulator(dv);
      fence_accumulator(dk);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_rs(dv, pa[kk], n_major_step(o_tile, kk));
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_rs(dk, dsa[kk], n_major_step(q_tile, kk));
      wgmma_commit();
      // dS^T rounded to bf16 as the dK product rounds it, for dQ (row key,
      // pairs of query columns), stored while dV and dK are computed: packed
      // again from dpt, since dsa's registers may not be read until the
      // products' wait.
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          *reinterpret_cast<uint32_t*>(sDs + SwizzledTile::chunk(warp * 16 + g + 8 * hf, nt) +
                                       2 * t) = pack_bf16(dpt[nt][2 * hf], dpt[nt][2 * hf + 1]);
      if (step > 0 && group == 0) finish_dq(rows_at(step - 1), buffer ^ 1);
      fence_shared_for_wgmma();
      __syncthreads();  // every warp's dS^T rows are in sDs, every warp past the last dQ's reads
      // dQ of the tile's 64 queries, dS K summed over the block's 128 keys:
      // each warpgroup sums its own 64 (A = dS read from dS^T, M-major; B =
      // K [key][dim], N-major). Both issue it, so no wgmma sits in a branch
      // (ptxas serializes every wgmma of a kernel that has one there).
      float acc[8][4];
      wgmma_fence();  // acc's registers may have held what other code wrote
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_ss<true, true>(acc, n_major_step(sDs + group * 64 * kD, ks), n_major_step(k_rows, ks),
                             ks > 0);
      wgmma_commit();
      // While it runs, the next tile's running sums and dq angles go into
      // the buffers the last tile's dQ read above: a group of their own,
      // which the wait at the end of the next tile covers.
      if (next < r.Lq && !first) sums.fetch(buffer ^ 1, streams[kStreamSums], r.Lq, next);
      if (stage_angles)
        copy_angles_async<kInnerTile, kThreadsPerBlock>(tile_angles(buffer ^ 1), r, next, r.Lq, a);
      cp_async_commit();
      wgmma_wait<0>();
      fence_accumulator(acc);
      fence_accumulator(dv);
      fence_accumulator(dk);
      fence_fragments(pa);  // the dV and dK products read them until here
      fence_fragments(dsa);
      // The twin's four column tiles go to sDq for it to add (the next
      // tile's barrier publishes them); this warp keeps its own four.
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          *reinterpret_cast<float2*>(sDq + (local * 16 + g + 8 * hf) * kAccLd +
                                     kept_tile(n, 1 - group) * 8 + 2 * t) =
              kept_pair(acc, n, 1 - group, hf);
          const float2 x = kept_pair(acc, n, group, hf);
          own[n][2 * hf] = x.x;
          own[n][2 * hf + 1] = x.y;
        }
      // The next tile's Q, dO and row data (this thread's copies: all but
      // the newest group, the sums just queued), made ready for the barrier
      // that opens it.
      cp_async_wait<1>();
      if (next < r.Lq) {
        qo.rotate_first(buffer ^ 1, next, r.Lq, a);
        rows.prepare(buffer ^ 1, a.scale);
      }
    }
    if (query_tiles > 0) {
      // The sweep's last tile's dQ, once its halves are in sDq; then a
      // barrier: the next sweep queues into both buffers and reads the sums
      // stored here.
      __syncthreads();
      finish_dq(rows_at(query_tiles - 1), (query_tiles - 1) & 1);
      __syncthreads();
    }
    const float one[2] = {1.0f, 1.0f};
    store_rows(dk, a.dk, a.grad_dtype, r, key0, r.Lk, one, a, rotate_grads, g, t);
    const float dv_scale[2] = {dropout_gain<kDropout>(a), dropout_gain<kDropout>(a)};
    store_rows(dv, a.dv, a.grad_dtype, r, key0, r.Lk, dv_scale, a, false, g, t);
    bf16_t* const k_done = k_tile;  // the early copies' buffers hold the next key tile
    bf16_t* const v_done = v_tile;
    k_tile = next_k, v_tile = next_v;
    next_k = k_done, next_v = v_done;
  }
  cp_async_wait<0>();  // a guard, as in the mma.sync kernel: nothing is in flight here
#else
  // Built without sm_90a's features: a launch fails loudly (as the forward's).
  (void)a;
  (void)tiles;
  (void)partials;
  (void)alternate_sweeps;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif
}

// The dynamic shared memory before the angles, with room to align the tiles;
// one block an SM.
constexpr size_t kKeyTileWgmmaShared =
    kSwizzleAtom + size_t(5 * kRowsPerBlock + 4 * kInnerTile) * kD * sizeof(bf16_t) +
    size_t(3 * kInnerTile * kAccLd) * sizeof(float) + kRowDataShared;
static_assert(kKeyTileWgmmaShared + kAngleBytes + kStreamBytes + kReservedPerBlock <= kSharedPerSm,
              "the wgmma key-tile kernel no longer fits an SM");

}  // namespace

void launch_key_tiles_wgmma(Stream stream, const FlashArgs& a, dim3 grid, int64_t splits,
                            const DqPartials& partials, bool alternate_sweeps) {
  const bool rotate_loads = a.rotate_loads;
  const auto kernel = a.drop.on ? (rotate_loads ? flash_key_tile_wgmma_kernel<true, true>
                                                : flash_key_tile_wgmma_kernel<true, false>)
                                : (rotate_loads ? flash_key_tile_wgmma_kernel<false, true>
                                                : flash_key_tile_wgmma_kernel<false, false>);
  // Angle slots for the tiles rotated as they load (RoPE inside) and for
  // dq's rotation as it is stored (both: wherever there is a table).
  const size_t shared = kKeyTileWgmmaShared + (a.table != nullptr ? kAngleBytes : 0);
  allow_shared(kernel, shared);
  RF_LAUNCH(kernel, grid, kThreadsPerBlock, shared, native(stream), a, splits, partials,
            alternate_sweeps);
}

}  // namespace roformer::kernels::cuda
