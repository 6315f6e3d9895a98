{choice: "judge"}
