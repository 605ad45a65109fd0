// TPC-H Query 6 style filter + aggregate over fixed-width rows, one chunk
// per launch. Compiled at run time with NVRTC by examples/src/bin/scan.rs;
// the CPU path there computes the same thing (keep them in step).
//
// Row layout (32 bytes, little-endian):
//   0  u32 shipdate   days since 1992-01-01
//   4  u32 discount   hundredths (0..10)
//   8  u32 quantity   1..50
//  12  u32 flags      unused here
//  16  i64 price      extended price, cents
//  24  u64 orderkey
//
// Every parameter is 64-bit (oncilla_cuda::kernel launches that way).
// out[0] += sum(price * discount), out[1] += matching rows.
extern "C" __global__ void q6(unsigned long long rows, unsigned long long n,
                              unsigned long long date_lo, unsigned long long date_hi,
                              unsigned long long disc_lo, unsigned long long disc_hi,
                              unsigned long long qty_max, unsigned long long out) {
    const unsigned char *base = (const unsigned char *)rows;
    unsigned long long *acc = (unsigned long long *)out;
    unsigned long long sum = 0, count = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const unsigned int *r = (const unsigned int *)(base + i * 32);
        unsigned int date = r[0], disc = r[1], qty = r[2];
        long long price = *(const long long *)(base + i * 32 + 16);
        if (date >= date_lo && date < date_hi && disc >= disc_lo && disc <= disc_hi &&
            qty < qty_max) {
            sum += (unsigned long long)price * disc;
            count += 1;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, off);
        count += __shfl_down_sync(0xffffffffu, count, off);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(acc, sum);
        atomicAdd(acc + 1, count);
    }
}
