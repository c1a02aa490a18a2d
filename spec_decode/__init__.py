"""spec_decode: lossless speculative decoding (Leviathan et al., 2023) for T5."""
