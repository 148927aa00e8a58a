"""What AI Toolkit's load_mask_image does to a mask's pixels (toolkit/dataloader_mixins.py:1582-1611):
PIL's ImageFilter.GaussianBlur on the RGB image, then convert('L'), as tests/data/masks_test.cpp compares
gclab's pil_gaussian_blur and pil_luminance with them.

  pil_mask_blur.py IMAGE RADIUS [IMAGE RADIUS ...]

For each IMAGE writes IMAGE.r<RADIUS>.rgb (the blurred RGB bytes, row by row) and IMAGE.r<RADIUS>.l (the
grey bytes after convert('L')).
"""
import sys

from PIL import Image, ImageFilter

args = sys.argv[1:]
for path, radius in zip(args[0::2], args[1::2]):
    img = Image.open(path).convert("RGB").filter(ImageFilter.GaussianBlur(radius=int(radius)))
    with open(f"{path}.r{radius}.rgb", "wb") as f:
        f.write(img.tobytes())
    with open(f"{path}.r{radius}.l", "wb") as f:
        f.write(img.convert("L").tobytes())
