"""What ``autotune tune`` decides, how robust it is and how long it takes."""
