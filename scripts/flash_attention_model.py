#!/usr/bin/python3
# A lane-level model of core/cuda/kernels/flash_attention.cu and
# flash_attention_backward.cu (the forward; the backward's delta kernel, the
# two-pass dq and dk/dv kernels, the fused key-tile kernel with one and two
# splits and its finalize), runnable without a GPU: the kernels' index arithmetic
# written again line by line in float64 -- tile loads with the RoPE chunks
# (the streamed tiles' angles through their shared slots),
# ldmatrix (.trans) and mma.m16n8k16 with the fragments of the PTX ISA, the
# online softmax, the dropout draws and their shuffles, the rotated-back gradients -- against a
# plain float64 attention. It checks the indexing, not bf16 rounding, and it
# does not read the .cu: after changing the kernels' index arithmetic, change
# it here the same way and run it (Debian's python3-numpy):
#   /usr/bin/python3 scripts/flash_attention_model.py [case number]
# Every case prints its largest relative errors (about 1e-15 when right).
import numpy as np

kD, kLd, kWarps = 64, 72, 8
kThreads = kWarps * 32
kRowsPerBlock, kInner = 16 * kWarps, 64
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453
M32 = 0xFFFFFFFF


# --- Philox (core/philox.h) ---------------------------------------------------
def philox(ctr, key):
    c = list(ctr)
    k = list(key)
    for _ in range(10):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k[0]) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k[1]) & M32, p0 & M32]
        k = [(k[0] + 0x9E3779B9) & M32, (k[1] + 0xBB67AE85) & M32]
    return c


def dropout_key(seed, step):
    k = (seed + (step + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    return [k & M32, k >> 32]


def dropout_block(inner_block, position, sequence, site, head):
    return [inner_block & M32, position & M32, sequence & M32, ((site << 8) | head) & M32]


# --- fragments ----------------------------------------------------------------
def ldmatrix(s, flat_addr, trans):
    """s: 2-D shared tile [rows, kLd]; flat_addr[lane]: element offset of the
    row lane gives. Returns regs [32, 4, 2]."""
    rows = [divmod(a, kLd) for a in flat_addr]
    out = np.zeros((32, 4, 2))
    for lane in range(32):
        for m in range(4):
            for x in range(2):
                if not trans:
                    r, c = rows[8 * m + lane // 4]
                    out[lane, m, x] = s[r, c + 2 * (lane % 4) + x]
                else:
                    r, c = rows[8 * m + 2 * (lane % 4) + x]
                    out[lane, m, x] = s[r, c + lane // 4]
    return out


def mma(d, a, b0, b1):
    """d [32, 4] += A (a [32, 4, 2]) B (b0, b1 [32, 2])."""
    A = np.full((16, 16), np.nan)
    B = np.full((16, 8), np.nan)
    C = np.full((16, 8), np.nan)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for x in range(2):
            A[g, 2 * t + x] = a[lane, 0, x]
            A[g + 8, 2 * t + x] = a[lane, 1, x]
            A[g, 2 * t + 8 + x] = a[lane, 2, x]
            A[g + 8, 2 * t + 8 + x] = a[lane, 3, x]
            B[2 * t + x, g] = b0[lane, x]
            B[2 * t + 8 + x, g] = b1[lane, x]
            C[g, 2 * t + x] = d[lane, x]
            C[g + 8, 2 * t + x] = d[lane, 2 + x]
    D = A @ B + C
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for x in range(2):
            d[lane, x] = D[g, 2 * t + x]
            d[lane, 2 + x] = D[g + 8, 2 * t + x]


def lanes():
    lane = np.arange(32)
    return lane, lane >> 3, lane & 7


def load_a(s, r0, k0):
    lane, m, r = lanes()
    return ldmatrix(s, (r0 + r + (m & 1) * 8) * kLd + k0 + (m >> 1) * 8, False)


def load_b_pair(s, n0, k0):
    lane, m, r = lanes()
    return ldmatrix(s, (n0 + r + (m >> 1) * 8) * kLd + k0 + (m & 1) * 8, False)


def load_b_trans_tiles(s, k0, n_a, n_b):
    lane, m, r = lanes()
    return ldmatrix(s, (k0 + r + (m & 1) * 8) * kLd + np.where(m >> 1, n_b, n_a), True)


def load_b_trans(s, k0, n0):
    return load_b_trans_tiles(s, k0, n0, n0 + 8)


def load_a_trans(s, r0, k0):
    lane, m, r = lanes()
    return ldmatrix(s, (k0 + r + (m >> 1) * 8) * kLd + r0 + (m & 1) * 8, True)


def accumulator_as_a(c, kk):
    a = np.zeros((32, 4, 2))
    a[:, 0] = c[:, 2 * kk, 0:2]
    a[:, 1] = c[:, 2 * kk, 2:4]
    a[:, 2] = c[:, 2 * kk + 1, 0:2]
    a[:, 3] = c[:, 2 * kk + 1, 2:4]
    return a


def mma_accumulator_tile(acc, c, s):
    for kk in range(4):
        a = accumulator_as_a(c, kk)
        for np_ in range(4):
            b = load_b_trans(s, kk * 16, np_ * 16)
            mma(acc[:, 2 * np_], a, b[:, 0], b[:, 1])
            mma(acc[:, 2 * np_ + 1], a, b[:, 2], b[:, 3])


def mma_rows(a, s):
    c = np.zeros((32, 8, 4))
    for ks in range(4):
        for np_ in range(4):
            b = load_b_pair(s, np_ * 16, ks * 16)
            mma(c[:, 2 * np_], a[ks], b[:, 0], b[:, 1])
            mma(c[:, 2 * np_ + 1], a[ks], b[:, 2], b[:, 3])
    return c


def quad(x, op):  # x [32] -> every lane gets op over its quad
    q = x.reshape(8, 4)
    return np.repeat(op(q, axis=1), 4)


# --- the problem ------------------------------------------------------------------
class Args:
    pass


def rotate_pair(x0, x1, a, pos, k, inverse):
    c = a.table[0, pos, k]
    s0 = a.table[1, pos, k]
    s = -s0 if inverse else s0
    return x0 * c - x1 * s, x1 * c + x0 * s


def rotate_chunks(lo, hi, a, pos, c):
    x, y = lo.copy(), hi.copy()
    if a.interleaved:
        for m in range(4):
            x[2 * m], x[2 * m + 1] = rotate_pair(x[2 * m], x[2 * m + 1], a, pos, 4 * c + m, False)
            y[2 * m], y[2 * m + 1] = rotate_pair(y[2 * m], y[2 * m + 1], a, pos, 16 + 4 * c + m, False)
    else:
        for e in range(8):
            x[e], y[e] = rotate_pair(x[e], y[e], a, pos, 8 * c + e, False)
    return x, y


def load_tile(rows, X, blk, r0, limit, a, rotate):
    """X: the sequence's rows [L, 64] (first = blk.first in the table)."""
    s = np.full((rows, kLd), np.nan)  # the padding columns stay NaN: a read shows
    for n in range(rows * 4 // kThreads):
        for tid in range(kThreads):
            item = tid + n * kThreads
            row, c = item >> 2, item & 3
            i = r0 + row
            lo, hi = np.zeros(8), np.zeros(8)
            if i < limit:
                lo, hi = X[i, 8 * c:8 * c + 8].copy(), X[i, 8 * c + 32:8 * c + 40].copy()
                if rotate:
                    lo, hi = rotate_chunks(lo, hi, a, blk.first + i, c)
            s[row, 8 * c:8 * c + 8] = lo
            s[row, 8 * c + 32:8 * c + 40] = hi
    return s


def chunk_pair(n, c, interleaved):
    return (4 * c + n if n < 4 else 16 + 4 * c + n - 4) if interleaved else 8 * c + n


def stream_tile(rows, X, blk, r0, limit, a, rotate):
    """copy_tile_async, then copy_angles_async's slots (cos of the chunk's
    local pairs 0..7, then their sin) and rotate_own_chunks reading them."""
    s = load_tile(rows, X, blk, r0, limit, a, False)
    if not rotate:
        return s
    slots = np.full((rows * 4, 20), np.nan)  # kAngleSlot floats an item; 16..19 unused
    for item in range(rows * 4):
        row, c = item >> 2, item & 3
        i = r0 + row
        if i >= limit:
            continue
        pos = blk.first + i
        k0, k1 = chunk_pair(0, c, a.interleaved), chunk_pair(4, c, a.interleaved)
        slots[item, 0:4] = a.table[0, pos, k0:k0 + 4]
        slots[item, 4:8] = a.table[0, pos, k1:k1 + 4]
        slots[item, 8:12] = a.table[1, pos, k0:k0 + 4]
        slots[item, 12:16] = a.table[1, pos, k1:k1 + 4]
    for item in range(rows * 4):
        row, c = item >> 2, item & 3
        if r0 + row >= limit:
            continue
        cos, sin = slots[item, 0:8], slots[item, 8:16]
        x, y = s[row, 8 * c:8 * c + 8].copy(), s[row, 8 * c + 32:8 * c + 40].copy()
        rot = lambda x0, x1, n: (x0 * cos[n] - x1 * sin[n], x1 * cos[n] + x0 * sin[n])
        if a.interleaved:
            for m in range(4):
                x[2 * m], x[2 * m + 1] = rot(x[2 * m], x[2 * m + 1], m)
                y[2 * m], y[2 * m + 1] = rot(y[2 * m], y[2 * m + 1], 4 + m)
        else:
            for e in range(8):
                x[e], y[e] = rot(x[e], y[e], e)
        s[row, 8 * c:8 * c + 8], s[row, 8 * c + 32:8 * c + 40] = x, y
    return s


def store_row_tiles(c, tile_of, OUT, blk, row0, limit, row_scale, a, unrotate):
    """c [32, kN, 4]: local column tile n is OUT's tile tile_of(n)."""
    kN = c.shape[1]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for hf in range(2):
            i = row0 + g + 8 * hf
            if i >= limit:
                continue
            x = np.zeros((kN, 2))
            for n in range(kN):
                x[n, 0] = c[lane, n, 2 * hf] * row_scale[lane, hf]
                x[n, 1] = c[lane, n, 2 * hf + 1] * row_scale[lane, hf]
            if unrotate:
                pos = blk.first + i
                if a.interleaved:
                    for n in range(kN):
                        x[n, 0], x[n, 1] = rotate_pair(x[n, 0], x[n, 1], a, pos, tile_of(n) * 4 + t, True)
                else:
                    for n in range(kN // 2):
                        for e in range(2):
                            x[n, e], x[n + kN // 2, e] = rotate_pair(x[n, e], x[n + kN // 2, e], a, pos,
                                                                     tile_of(n) * 8 + 2 * t + e, True)
            for n in range(kN):
                OUT[i, tile_of(n) * 8 + 2 * t] = x[n, 0]
                OUT[i, tile_of(n) * 8 + 2 * t + 1] = x[n, 1]


def store_rows(c, OUT, blk, row0, limit, row_scale, a, unrotate):
    store_row_tiles(c, lambda n: n, OUT, blk, row0, limit, row_scale, a, unrotate)


def key_bias(a, blk, j):
    if j >= blk.Lk:
        return -np.inf
    if blk.mask is not None and not blk.mask[j]:
        return -np.inf
    return 0.0


def key_tile_masked(a, blk, j0, keys):
    return j0 + keys > blk.Lk or blk.mask is not None


def keep_mask(a, blk, row0, j0):
    # keep_mask: each lane draws the blocks of tiles 2t + c of its rows and
    # hands word t' of each to lane t' of its quad by __shfl_xor_sync.
    keep = [0] * 32
    for q in range(4):
        hf, c = q >> 1, q & 1
        drawn = []
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            position = blk.drop_position + row0 + g + 8 * hf
            first_key = j0 + (2 * t + c) * 8
            drawn.append(philox(dropout_block(first_key // 8, position, blk.drop_sequence, a.site, blk.h), a.key))
        # send[x] = word t ^ x: two conditional swaps on t's bits.
        send = []
        for lane in range(32):
            t, w = lane & 3, list(drawn[lane])
            if t & 1:
                w = [w[1], w[0], w[3], w[2]]
            if t & 2:
                w = [w[2], w[3], w[0], w[1]]
            send.append(w)
        for x in range(4):
            for lane in range(32):
                t = lane & 3
                got = send[lane ^ x][x]
                bit = hf * 16 + 4 * (t ^ x) + 2 * c
                keep[lane] |= int((got & 0xFFFF) >= a.threshold) << bit
                keep[lane] |= int((got >> 16) >= a.threshold) << (bit + 1)
    if j0 + kInner > blk.Lk:  # keys past the end: one arithmetic mask
        for lane in range(32):
            t, left, valid = lane & 3, blk.Lk - j0, 0
            for e in range(2):
                count = max((left - 2 * t - e + 7) // 8, 0)
                valid |= (((1 << (2 * count)) - 1) & 0x5555) << e
            keep[lane] &= valid | (valid << 16)
    return keep


def dropout_tile(p, a, blk, row0, j0, BITS):
    words = np.zeros((32, 2, 2), dtype=np.int64)
    keep_bits = keep_mask(a, blk, row0, j0)
    for lane in range(32):
        t = lane & 3
        for hf in range(2):
            for nt in range(8):
                for e in range(2):
                    keep = (keep_bits[lane] >> (hf * 16 + 2 * nt + e)) & 1
                    p[lane, nt, 2 * hf + e] = p[lane, nt, 2 * hf + e] * a.inv_keep if keep else 0.0
            for w in range(2):  # keep's byte of tiles 4w..4w+3, pairs spread a byte apart
                b = (keep_bits[lane] >> (hf * 16 + 8 * w)) & 0xFF
                spread = (b & 0x0F) | ((b & 0xF0) << 12)
                spread = (spread & 0x00030003) | ((spread & 0x000C000C) << 6)
                words[lane, hf, w] = spread << (2 * t)
    row_words = (blk.Lk + 31) // 32
    for hf in range(2):
        for w in range(2):
            word = quad(words[:, hf, w], np.bitwise_or.reduce)
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                i, index = row0 + g + 8 * hf, j0 // 32 + w
                if t == 2 * hf + w and i < blk.Lq and index < row_words:
                    BITS[i, index] = word[lane]


def forward_block(a, blk, Q, K, V, OUT, LSE, BITS):
    i0 = blk.tile * kRowsPerBlock
    if i0 >= blk.Lq:
        return
    rope = a.table is not None
    sQ = load_tile(kRowsPerBlock, Q, blk, i0, blk.Lq, a, rope)
    for warp in range(kWarps):
        qa = [load_a(sQ, warp * 16, ks * 16) for ks in range(4)]
        row0 = i0 + warp * 16
        o = np.zeros((32, 8, 4))
        m = np.full((32, 2), -np.inf)
        l = np.zeros((32, 2))
        t = np.arange(32) & 3
        for j0 in range(0, blk.Lk, kInner):
            sK = stream_tile(kInner, K, blk, j0, blk.Lk, a, rope)
            sV = stream_tile(kInner, V, blk, j0, blk.Lk, a, False)
            sBias = np.array([key_bias(a, blk, j0 + x) for x in range(kInner)])
            s = mma_rows(qa, sK)
            # online_softmax_tile: biases only in a tile with a key to leave
            # out; the max over raw scores, the scale inside the exponent.
            if key_tile_masked(a, blk, j0, kInner):
                for nt in range(8):
                    for e in range(4):
                        s[:, nt, e] += sBias[nt * 8 + 2 * t + (e & 1)]
            mx = m.copy()
            for nt in range(8):
                for e in range(4):
                    mx[:, e >> 1] = np.fmax(mx[:, e >> 1], s[:, nt, e])
            corr = np.zeros((32, 2))
            shift = np.zeros((32, 2))
            for hf in range(2):
                mx[:, hf] = quad(mx[:, hf], np.max)
                none = mx[:, hf] == -np.inf
                with np.errstate(invalid="ignore"):
                    corr[:, hf] = np.where(none, 1.0, np.exp2((m[:, hf] - mx[:, hf]) * a.scale_log2))
                shift[:, hf] = np.where(none, 0.0, mx[:, hf] * a.scale_log2)
                m[:, hf] = mx[:, hf]
                l[:, hf] *= corr[:, hf]
            for nt in range(8):
                for e in range(4):
                    hf = e >> 1
                    p = np.exp2(s[:, nt, e] * a.scale_log2 - shift[:, hf])
                    s[:, nt, e] = p
                    l[:, hf] += p
                    o[:, nt, e] *= corr[:, hf]
            if a.drop_on:
                dropout_tile(s, a, blk, row0, j0, BITS)
            mma_accumulator_tile(o, s, sV)
        inv = np.zeros((32, 2))
        for hf in range(2):
            l[:, hf] = quad(l[:, hf], np.sum)
            empty = m[:, hf] == -np.inf
            with np.errstate(divide="ignore"):
                inv[:, hf] = np.where(empty, 0.0, 1.0 / l[:, hf])
            for lane in range(32):
                g, tt = lane >> 2, lane & 3
                i = row0 + g + 8 * hf
                if tt == 0 and i < blk.Lq:
                    LSE[i] = (-np.inf if empty[lane] else
                              (m[lane, hf] * a.scale_log2 + np.log2(l[lane, hf])) * LN2)
        store_rows(o, OUT, blk, row0, blk.Lq, inv, a, False)


def dq_block(a, blk, Q, K, V, LSE, BITS, DO, DQ, DELTA):
    i0 = blk.tile * kRowsPerBlock
    if i0 >= blk.Lq:
        return
    rope = a.table is not None
    sQ = load_tile(kRowsPerBlock, Q, blk, i0, blk.Lq, a, rope)
    sO = load_tile(kRowsPerBlock, DO, blk, i0, blk.Lq, a, False)
    for warp in range(kWarps):
        qa = [load_a(sQ, warp * 16, ks * 16) for ks in range(4)]
        da = [load_a(sO, warp * 16, ks * 16) for ks in range(4)]
        row0 = i0 + warp * 16
        Ds = np.zeros((32, 2))  # D times the scale
        lse2 = np.zeros((32, 2))  # log2 units, +inf for a row with no key
        for hf in range(2):
            for lane in range(32):
                g = lane >> 2
                i = row0 + g + 8 * hf
                Ds[lane, hf] = DELTA[i] * a.scale if i < blk.Lq else 0.0
                lse = LSE[i] if i < blk.Lq else -np.inf
                lse2[lane, hf] = np.inf if lse == -np.inf else lse * LOG2E
        dq = np.zeros((32, 8, 4))
        for j0 in range(0, blk.Lk, kInner):
            sK = stream_tile(kInner, K, blk, j0, blk.Lk, a, rope)
            sV = stream_tile(kInner, V, blk, j0, blk.Lk, a, False)
            sBias = np.array([key_bias(a, blk, j0 + x) for x in range(kInner)])
            s = mma_rows(qa, sK)
            dp = mma_rows(da, sV)
            bits = np.zeros((32, 2, 2), dtype=np.int64)
            if a.drop_on:
                for lane in range(32):
                    g = lane >> 2
                    for hf in range(2):
                        i = row0 + g + 8 * hf
                        row_words = (blk.Lk + 31) // 32
                        for w in range(2):
                            if i < blk.Lq and j0 // 32 + w < row_words:
                                bits[lane, hf, w] = BITS[i, j0 // 32 + w]
            masked = key_tile_masked(a, blk, j0, kInner)
            for lane in range(32):
                t = lane & 3
                for nt in range(8):
                    for e in range(4):
                        hf, col = e >> 1, nt * 8 + 2 * t + (e & 1)
                        x = s[lane, nt, e] + (sBias[col] if masked else 0.0)
                        p = np.exp2(x * a.scale_log2 - lse2[lane, hf])
                        zs = ((a.inv_keep * a.scale if (bits[lane, hf, col >> 5] >> (col & 31)) & 1 else 0.0)
                              if a.drop_on else a.scale)
                        s[lane, nt, e] = p * (dp[lane, nt, e] * zs - Ds[lane, hf])
            mma_accumulator_tile(dq, s, sK)
        store_rows(dq, DQ, blk, row0, blk.Lq, np.ones((32, 2)), a, rope)


def delta_rows(blk, OUT, DO, DELTA):
    """flash_delta_kernel: a row's four chunks (dims 8c... and 8c + 32...) on
    a quad's lanes, summed across the quad."""
    for i in range(blk.Lq):
        partial = [sum(DO[i, 8 * c + 32 * h + e] * OUT[i, 8 * c + 32 * h + e]
                       for h in range(2) for e in range(8)) for c in range(4)]
        DELTA[i] = sum(partial)


def key_tile_block(a, blk, tiles, Q, K, V, LSE, BITS, DO, DELTA, DK, DV, fused=None):
    """flash_key_tile_kernel: key tiles blk.tile, blk.tile + tiles, ... of
    the sequence. fused = (DQ, SUMS [splits, Lq, 64]) adds dQ (kDq)."""
    rope = a.table is not None
    kt = blk.tile
    while kt * kRowsPerBlock < blk.Lk:
        j0 = kt * kRowsPerBlock
        first, last = kt == blk.tile, (kt + tiles) * kRowsPerBlock >= blk.Lk
        sK = load_tile(kRowsPerBlock, K, blk, j0, blk.Lk, a, rope)
        sV = load_tile(kRowsPerBlock, V, blk, j0, blk.Lk, a, False)
        first_word, row_words = j0 // 32, (blk.Lk + 31) // 32
        # A thread's two keys' biases, added only in a key tile that has a key to leave out.
        masked = key_tile_masked(a, blk, j0, kRowsPerBlock)
        bias_of = np.zeros((kWarps, 32, 2))
        for warp in range(kWarps):
            for lane in range(32):
                for hf in range(2):
                    bias_of[warp, lane, hf] = key_bias(a, blk, j0 + warp * 16 + (lane >> 2) + 8 * hf)
        dk = np.zeros((kWarps, 32, 8, 4))
        dv = np.zeros((kWarps, 32, 8, 4))
        for i0 in range(0, blk.Lq, kInner):
            sQ = stream_tile(kInner, Q, blk, i0, blk.Lq, a, rope)
            sO = stream_tile(kInner, DO, blk, i0, blk.Lq, a, False)
            # QueryRowData::prepare: lse in log2 units (+inf for no key or past the end), D times the scale.
            raw = [LSE[i0 + x] if i0 + x < blk.Lq else -np.inf for x in range(kInner)]
            sLse2 = np.array([np.inf if v == -np.inf else v * LOG2E for v in raw])
            sDs = np.array([DELTA[i0 + x] * a.scale if i0 + x < blk.Lq else 0.0 for x in range(kInner)])
            sBits = np.zeros(256, dtype=np.int64)
            if a.drop_on:
                for tid in range(256):
                    qi, w = tid >> 2, tid & 3
                    i = i0 + qi
                    sBits[tid] = BITS[i, first_word + w] if i < blk.Lq and first_word + w < row_words else 0
            sDsT = np.full((kRowsPerBlock, kLd), np.nan)  # dS^T; padding columns stay NaN
            for warp in range(kWarps):
                ka = [load_a(sK, warp * 16, ks * 16) for ks in range(4)]
                st = mma_rows(ka, sQ)
                va = [load_a(sV, warp * 16, ks * 16) for ks in range(4)]
                dpt = mma_rows(va, sO)
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    for nt in range(8):
                        for e in range(4):
                            hf, col = e >> 1, nt * 8 + 2 * t + (e & 1)
                            key = warp * 16 + g + 8 * hf
                            x = st[lane, nt, e] + (bias_of[warp, lane, hf] if masked else 0.0)
                            p = np.exp2(x * a.scale_log2 - sLse2[col])
                            kept = (sBits[col * 4 + (key >> 5)] >> (key & 31)) & 1 if a.drop_on else 1
                            z = (a.inv_keep if kept else 0.0) if a.drop_on else 1.0
                            zs = (a.inv_keep * a.scale if kept else 0.0) if a.drop_on else a.scale
                            ds = p * (dpt[lane, nt, e] * zs - sDs[col])
                            st[lane, nt, e] = p * z
                            dpt[lane, nt, e] = ds
                            sDsT[key, col] = ds
                mma_accumulator_tile(dv[warp], st, sO)
                mma_accumulator_tile(dk[warp], dpt, sQ)
            if fused is None:
                continue
            DQ, SUMS = fused
            splits = SUMS.shape[0]
            for warp in range(kWarps):  # dQ = dS K, warps as 4 x 2
                wm, wn = warp & 3, warp >> 2
                tile_of = lambda n, wn=wn: wn + 2 * n
                acc = np.zeros((32, 4, 4))
                for ks in range(kRowsPerBlock // 16):
                    afrag = load_a_trans(sDsT, wm * 16, ks * 16)
                    for np_ in range(2):
                        b = load_b_trans_tiles(sK, ks * 16, tile_of(2 * np_) * 8, tile_of(2 * np_ + 1) * 8)
                        mma(acc[:, 2 * np_], afrag, b[:, 0], b[:, 1])
                        mma(acc[:, 2 * np_ + 1], afrag, b[:, 2], b[:, 3])
                if not first:
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        for hf in range(2):
                            i = i0 + wm * 16 + g + 8 * hf
                            if i >= blk.Lq:
                                continue
                            for n in range(4):
                                col = tile_of(n) * 8 + 2 * t
                                acc[lane, n, 2 * hf] += SUMS[blk.tile, i, col]
                                acc[lane, n, 2 * hf + 1] += SUMS[blk.tile, i, col + 1]
                one = np.ones((32, 2))
                if last and splits == 1:
                    store_row_tiles(acc, tile_of, DQ, blk, i0 + wm * 16, blk.Lq, one, a, rope)
                else:
                    store_row_tiles(acc, tile_of, SUMS[blk.tile], blk, i0 + wm * 16, blk.Lq, one, a, False)
        for warp in range(kWarps):
            key0 = j0 + warp * 16
            store_rows(dk[warp], DK, blk, key0, blk.Lk, np.ones((32, 2)), a, rope)
            store_rows(dv[warp], DV, blk, key0, blk.Lk, np.ones((32, 2)), a, False)
        kt += tiles


def finalize_dq(a, blk, SUMS, DQ):
    """flash_dq_finalize_kernel: the used splits' sums in split order, rotated back."""
    used = min(SUMS.shape[0], (blk.Lk + kRowsPerBlock - 1) // kRowsPerBlock)
    for i in range(blk.Lq):
        for c in range(4):
            x, y = np.zeros(8), np.zeros(8)
            for s_ in range(used):
                x += SUMS[s_, i, 8 * c:8 * c + 8]
                y += SUMS[s_, i, 8 * c + 32:8 * c + 40]
            if a.table is not None:
                for n in range(8):
                    k = chunk_pair(n, c, a.interleaved)
                    if a.interleaved:
                        v = x if n < 4 else y
                        m = n % 4
                        v[2 * m], v[2 * m + 1] = rotate_pair(v[2 * m], v[2 * m + 1], a, blk.first + i, k, True)
                    else:
                        x[n], y[n] = rotate_pair(x[n], y[n], a, blk.first + i, k, True)
            DQ[i, 8 * c:8 * c + 8], DQ[i, 8 * c + 32:8 * c + 40] = x, y


def backward(a, blk, scheme, Q, K, V, OUT, LSE, BITS, DO):
    """scheme: 0 = two passes, n >= 1 = fused with n splits (at most the key tiles)."""
    DQ = np.full((blk.Lq, 64), np.nan)
    DK = np.full((blk.Lk, 64), np.nan)
    DV = np.full((blk.Lk, 64), np.nan)
    DELTA = np.full(blk.Lq, np.nan)
    delta_rows(blk, OUT, DO, DELTA)
    key_tiles = (blk.Lk + kRowsPerBlock - 1) // kRowsPerBlock
    if scheme == 0:
        for tile in range((blk.Lq + kRowsPerBlock - 1) // kRowsPerBlock):
            blk.tile = tile
            dq_block(a, blk, Q, K, V, LSE, BITS, DO, DQ, DELTA)
        for tile in range(key_tiles):
            blk.tile = tile
            key_tile_block(a, blk, key_tiles, Q, K, V, LSE, BITS, DO, DELTA, DK, DV)
        return DQ, DK, DV
    splits = min(scheme, max(key_tiles, 1))
    SUMS = np.full((splits, blk.Lq, 64), np.nan)  # scratch: a read before a write shows
    for tile in range(splits):
        blk.tile = tile
        key_tile_block(a, blk, splits, Q, K, V, LSE, BITS, DO, DELTA, DK, DV, (DQ, SUMS))
    if splits > 1 or key_tiles == 0:
        finalize_dq(a, blk, SUMS, DQ)
    return DQ, DK, DV


# --- reference ---------------------------------------------------------------------
def rope_rows(X, table, first, interleaved, inverse=False):
    Y = X.copy()
    for i in range(X.shape[0]):
        for k in range(32):
            lo, hi = (2 * k, 2 * k + 1) if interleaved else (k, k + 32)
            c, s = table[0, first + i, k], table[1, first + i, k]
            if inverse:
                s = -s
            Y[i, lo] = X[i, lo] * c - X[i, hi] * s
            Y[i, hi] = X[i, hi] * c + X[i, lo] * s
    return Y


def reference(a, blk, Q, K, V, DO):
    rope = a.table is not None
    Qr = rope_rows(Q[:blk.Lq], a.table, blk.first, a.interleaved) if rope else Q[:blk.Lq]
    Kr = rope_rows(K[:blk.Lk], a.table, blk.first, a.interleaved) if rope else K[:blk.Lk]
    Vv, dO = V[:blk.Lk], DO[:blk.Lq]
    S = Qr @ Kr.T * a.scale
    bias = np.array([key_bias(a, blk, j) for j in range(blk.Lk)])
    S = S + bias
    m = S.max(axis=1, keepdims=True) if blk.Lk else np.full((blk.Lq, 1), -np.inf)
    with np.errstate(invalid="ignore"):
        E = np.where(np.isfinite(m), np.exp(S - m), 0.0)
    tot = E.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        P = np.where(tot > 0, E / tot, 0.0)
        lse = np.where(np.isfinite(m[:, 0]), m[:, 0] + np.log(tot[:, 0]), -np.inf)
    Z = np.ones_like(P)
    W = (blk.Lk + 31) // 32
    bits = np.zeros((blk.Lq, max(W, 1)), dtype=np.int64)
    if a.drop_on:
        for i in range(blk.Lq):
            for j in range(blk.Lk):
                # the rule of core/philox.h: draw j % 8 of block j / 8, 16 bits
                w = philox(dropout_block(j // 8, blk.drop_position + i, blk.drop_sequence, a.site, blk.h), a.key)
                word = w[(j % 8) // 2]
                keep = ((word >> 16) if j % 2 else (word & 0xFFFF)) >= a.threshold
                Z[i, j] = a.inv_keep if keep else 0.0
                bits[i, j // 32] |= int(keep) << (j % 32)
    Pd = P * Z
    out = Pd @ Vv
    dV = Pd.T @ dO
    dPd = dO @ Vv.T
    D = (dO * out).sum(axis=1, keepdims=True)
    dS = P * (dPd * Z - D) * a.scale
    dQr, dKr = dS @ Kr, dS.T @ Qr
    dQ = rope_rows(dQr, a.table, blk.first, a.interleaved, True) if rope else dQr
    dK = rope_rows(dKr, a.table, blk.first, a.interleaved, True) if rope else dKr
    return out, lse, bits, dQ, dK, dV


def run_case(name, L_q, L_k, first, mask, rope, interleaved, drop, seed):
    rng = np.random.default_rng(seed)
    a = Args()
    a.scale = 0.3
    a.scale_log2 = a.scale * LOG2E
    a.interleaved = interleaved
    P = first + max(L_q, L_k) + 3
    if rope:
        pos = np.arange(P) + 2
        theta = 10000.0 ** (-2.0 * np.arange(32) / 64)
        ang = pos[:, None] * theta[None, :]
        a.table = np.stack([np.cos(ang), np.sin(ang)])
    else:
        a.table = None
    a.drop_on = drop > 0
    a.key = dropout_key(17, 3)
    a.site = 2
    a.threshold = int(np.ceil(drop * 65536.0))
    a.inv_keep = 1.0 / (1.0 - drop) if drop > 0 else 1.0
    blk = Args()
    blk.first, blk.Lq, blk.Lk, blk.h, blk.mask = first, L_q, L_k, 1, mask
    blk.drop_sequence, blk.drop_position = 5 + 3, 11
    # The operands as the kernel sees them: rows first + i of the stream (the
    # table is indexed by first + i too).
    Q = rng.standard_normal((L_q, 64))
    K = rng.standard_normal((L_k, 64))
    V = rng.standard_normal((L_k, 64))
    DO = rng.standard_normal((L_q, 64))
    OUT = np.full((L_q, 64), np.nan)
    LSE = np.full(L_q, np.nan)
    W = (L_k + 31) // 32
    BITS = np.full((L_q, max(W, 1)), -1, dtype=np.int64)
    for tile in range((L_q + kRowsPerBlock - 1) // kRowsPerBlock + 1):  # one extra: exits
        blk.tile = tile
        forward_block(a, blk, Q, K, V, OUT, LSE, BITS)
    out, lse, bits, dQ, dK, dV = reference(a, blk, Q, K, V, DO)

    def err(x, y):
        if x.size == 0:
            return 0.0
        if np.isnan(x).any():
            return np.inf
        return np.abs(x - y).max() / max(np.abs(y).max(), 1.0)

    lse_ok = np.array_equal(np.isinf(LSE), np.isinf(lse)) and np.allclose(
        LSE[np.isfinite(lse)], lse[np.isfinite(lse)], rtol=1e-12, atol=1e-12)
    bits_ok = (not a.drop_on) or np.array_equal(BITS[:, :W] & M32, bits[:, :W])
    ok = lse_ok and bits_ok and err(OUT, out) < 1e-11
    print(f"{name:40s} out {err(OUT, out):.1e} lse {'ok' if lse_ok else 'BAD'} "
          f"bits {'ok' if bits_ok else 'BAD'}")
    for scheme, label in ((0, "two passes"), (1, "fused, 1 split"), (2, "fused, 2 splits")):
        DQ, DK, DV = backward(a, blk, scheme, Q, K, V, OUT, LSE, BITS, DO)
        errs = [err(DQ, dQ), err(DK, dK), err(DV, dV)]
        good = max(errs) < 1e-11
        ok = ok and good
        print(f"    {label:36s} dq {errs[0]:.1e} dk {errs[1]:.1e} dv {errs[2]:.1e} "
              f"-> {'OK' if good else 'FAIL'}")
    return ok


if __name__ == "__main__":
    import sys
    results = []
    mask = np.ones(150, dtype=bool)
    mask[[3, 70, 71, 140]] = False
    mask[100:120] = False
    cases = [
        ("plain 150x150", 150, 150, 0, None, False, True, 0.0),
        ("rope interleaved, mask, dropout", 150, 150, 0, mask, True, True, 0.2),
        ("rope half, first 7, dropout", 70, 70, 7, None, True, False, 0.15),
        ("rope half 130 (two tiles)", 130, 130, 3, None, True, False, 0.0),
        ("length 1, dropout", 1, 1, 40, None, True, True, 0.3),
        ("all keys masked", 20, 20, 0, np.zeros(20, dtype=bool), False, True, 0.1),
        ("cross 40 queries x 90 keys", 40, 90, 0, None, False, True, 0.1),
    ]
    only = int(sys.argv[1]) if len(sys.argv) > 1 else None
    for n, c in enumerate(cases):
        if only is not None and n != only:
            continue
        results.append(run_case(*c, seed=n))
    print("ALL OK" if all(results) else "SOME FAILED")
    sys.exit(0 if all(results) else 1)
