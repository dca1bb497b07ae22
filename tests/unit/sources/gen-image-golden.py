#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write tests/unit/sources/image-golden.h: PIL's outputs for deterministic resize and
center-crop chains, as FNV-1a 64 hashes of the RGB bytes.

test-image.c checks the daemon's resampling against this table, so its
coefficients are checked against PIL itself and not against a copy of the
production code (the differential reference there shares them). Run it with
Debian's python3 (python3-pil) after changing the cases; commit the header.
"""
import sys

from PIL import Image

# (width, height, transforms JSON, PIL steps): a step is ("resize", w, h)
# or ("crop", left, top, w, h), as torchvision.transforms would call PIL.
CASES = [
    (37, 23, '[{"op": "resize", "size": [13, 29]}]', [("resize", 29, 13)]),
    (150, 90, '[{"op": "resize", "size": [40, 60]}]', [("resize", 60, 40)]),
    (64, 64, '[{"op": "resize", "size": [17, 9]}]', [("resize", 9, 17)]),
    (7, 5, '[{"op": "resize", "size": [20, 30]}]', [("resize", 30, 20)]),
    (1, 1, '[{"op": "resize", "size": [4, 4]}]', [("resize", 4, 4)]),
    (300, 40, '[{"op": "resize", "size": [3, 200]}]', [("resize", 200, 3)]),
    (120, 80, '[{"op": "resize", "size": 20}, {"op": "center_crop", "size": 16}]',
     [("resize", 30, 20), ("crop", 7, 2, 16, 16)]),
    (90, 150, '[{"op": "center_crop", "size": [70, 45]}]', [("crop", 22, 40, 45, 70)]),
    (100, 100, '[{"op": "center_crop", "size": 30}, {"op": "resize", "size": 11}]',
     [("crop", 35, 35, 30, 30), ("resize", 11, 11)]),
    (41, 33, '[{"op": "resize", "size": [33, 41]}, {"op": "resize", "size": 17}, '
             '{"op": "center_crop", "size": 15}]',
     [("resize", 41, 33), ("resize", 21, 17), ("crop", 3, 1, 15, 15)]),
    (256, 171, '[{"op": "resize", "size": [224, 224]}]', [("resize", 224, 224)]),
    (500, 375, '[{"op": "resize", "size": 256}, {"op": "center_crop", "size": 224}]',
     [("resize", 341, 256), ("crop", 58, 16, 224, 224)]),
]


def pattern(w, h):
    """The same bytes as test-image.c's golden_pattern()."""
    out = bytearray(w * h * 3)
    for i in range(len(out)):
        out[i] = ((i * 7) // 3 ^ ((i * 2654435761) >> 13)) & 0xff
    return bytes(out)


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h


def run(w, h, steps):
    img = Image.frombytes("RGB", (w, h), pattern(w, h))
    for s in steps:
        if s[0] == "resize":
            img = img.resize((s[1], s[2]), Image.BILINEAR)
        else:
            img = img.crop((s[1], s[2], s[1] + s[3], s[2] + s[4]))
    return img


def main():
    out = ["/* SPDX-License-Identifier: MIT */",
           "/* image-golden - PIL's outputs for test-image.c (tests/unit/sources/gen-image-golden.py wrote it) */",
           "#pragma once", "", "#include <stdint.h>", "",
           "static const struct golden {", "\tint w, h;", "\tconst char *transforms;",
           "\tint out_w, out_h;", "\tuint64_t fnv;", "} golden[] = {"]
    for w, h, tr, steps in CASES:
        img = run(w, h, steps)
        esc = tr.replace('"', '\\"')
        out.append(f'\t{{ {w}, {h}, "{esc}", {img.size[0]}, {img.size[1]}, '
                   f'0x{fnv1a(img.tobytes()):016x}ull }},')
    out.append("};")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
