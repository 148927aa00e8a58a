"""What AI Toolkit loads for each image: PIL's ImageOps.exif_transpose (toolkit/dataloader_mixins.py:896,
toolkit/data_transfer_object/data_loader.py:158), as tests/data/dataset_test.cpp compares gclab's with it.

  exif_transpose.py IMAGE...

For each IMAGE writes IMAGE.rgb: the upright RGB pixels, row by row, and prints "WIDTH HEIGHT".
"""
import sys

from PIL import Image, ImageOps

for path in sys.argv[1:]:
    img = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
    with open(path + ".rgb", "wb") as f:
        f.write(img.tobytes())
    print(img.size[0], img.size[1])
