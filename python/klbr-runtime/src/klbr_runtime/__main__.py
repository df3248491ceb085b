from klbr_runtime.runner import main

main()
