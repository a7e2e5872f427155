"""Unpacks the reservoir wheel into SITE (for PYTHONPATH), keeping the
archive's file times: torch's extension builder (ninja) rebuilds the C++
face when its source looks newer than the build, so a fresh unpack of the
same wheel must not look newer.

  python unpack.py WHEEL SITE
"""

import os
import shutil
import sys
import time
import zipfile


def main(argv):
    whl, site = argv
    if os.path.isdir(site):
        shutil.rmtree(site)
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)
        for info in z.infolist():
            t = time.mktime(info.date_time + (0, 0, -1))
            os.utime(os.path.join(site, info.filename), (t, t))
    print(f"unpacked {os.path.basename(whl)} into {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
