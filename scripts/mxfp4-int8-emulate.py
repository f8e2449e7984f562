#!/usr/bin/env python3
# Emulates, on the host, the int8 MXFP4 block product of the decode step's kernels (mmv.cuh
# mmv_mxfp4_i8 and mmv_chunk_rows_q8_mxfp4, STRATA_MXFP4_INT8=1): PTX prmt's default mode for
# __byte_perm, the funnel shift of the codes read as aligned words at each of the 4 alignments,
# __dp4a; and compares the integer sum of each random block with the format's definition (quant.c
# st_kvalues_mxfp4: low nibble weight j, high nibble weight j + 16). Prints "ok" or fails an assert.
import random, struct
def byte_perm(x, y, s):
    b = list(struct.pack('<II', x & 0xffffffff, y & 0xffffffff))
    r = 0
    for i in range(4):
        sel = (s >> (4*i)) & 0xf
        v = b[sel & 7]
        if sel & 8: v = 0xff if v & 0x80 else 0
        r |= v << (8*i)
    return r
POS0,POS1,NEG0,NEG1=0x03020100,0x0C080604,0xFDFEFF00,0xF4F8FAFC
def i8(h):
    m = h & 0x7777
    pos = byte_perm(POS0,POS1,m); neg = byte_perm(NEG0,NEG1,m)
    return byte_perm(pos, neg, 0x3210 | ((h & 0x8888) >> 1))
def sb(x): return x-256 if x>127 else x
def dp4a(a,b,c):
    return c + sum(sb((a>>(8*i))&255)*sb((b>>(8*i))&255) for i in range(4))
kv=[0,1,2,3,4,6,8,12,0,-1,-2,-3,-4,-6,-8,-12]
for trial in range(2000):
    off = random.randrange(4)
    buf = bytes(random.randrange(256) for _ in range(off)) + bytes([random.randrange(256)]) + bytes(random.randrange(256) for _ in range(16)) + bytes(8)
    qs = buf[off+1:off+17]
    x = [random.randrange(-127,128) for _ in range(32)]
    ref = sum(kv[qs[j] & 15]*x[j] + kv[qs[j]>>4]*x[j+16] for j in range(16))
    xa = [struct.unpack('<I', bytes(v & 255 for v in x[4*i:4*i+4]))[0] for i in range(4)]
    xb = [struct.unpack('<I', bytes(v & 255 for v in x[16+4*i:16+4*i+4]))[0] for i in range(4)]
    p = off + 1; base = p & ~3; sh = (p & 3) * 8
    w = [struct.unpack('<I', buf[base+4*i:base+4*i+4])[0] for i in range(5)]
    s = 0
    for i in range(4):
        c = ((w[i] | (w[i+1] << 32)) >> sh) & 0xffffffff
        s = dp4a(i8(c), byte_perm(xa[i], xb[i], 0x5140), s)
        s = dp4a(i8(c >> 16), byte_perm(xa[i], xb[i], 0x7362), s)
    assert s == ref, (trial, s, ref)
print("ok: 2000 blocks, integer sums equal")
