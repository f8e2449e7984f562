/* C interface of the CUDA variant of the combine codelet (combine.cu). */
#ifndef ST_CUDA_COMBINE_H
#define ST_CUDA_COMBINE_H

#ifdef __cplusplus
extern "C" {
#endif

/* The combine codelet's CUDA function: same buffers and arguments as combine_cpu (codelets.h),
 * queued on the worker's local stream (the codelet is flagged STARPU_CUDA_ASYNC). */
void st_combine_cuda(void *buffers[], void *cl_arg);

#ifdef __cplusplus
}
#endif

#endif
