"""Device kernels shared by the FA and hybrid paths (no SGLang import: the GPU kit loads them bare)."""
