// Anchor translation unit: gives the shared LibTorch precompiled header a target to live in.
